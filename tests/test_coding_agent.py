"""The built-in coding agent (harness_examples/coding/agent.py): its tools on a real directory,
and whole runs under `harnessrl run` against the proxy (prefix mode) over the scripted vLLM
stand-in, which calls the agent's bash tool with a scripted edit (tests/scripted_agent.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from coding_edits import fix_command, needle, wrong_command

from harnessrl.harness_examples.coding.agent import OUTPUT_LIMIT, Tools, clip
from harnessrl.harness_examples.coding.tasks import generate
from harnessrl.harness_examples.chat import ToolCall, run_tool

AGENT = [sys.executable, "-m", "harnessrl.harness_examples.coding.agent"]


def _call(tools: Tools, name: str, **arguments) -> tuple[str, bool]:
    return run_tool(ToolCall("c1", name, json.dumps(arguments), arguments), tools.table())


# ---- the tools -------------------------------------------------------------------------------

def test_edit_replaces_one_unique_snippet_and_refuses_missing_or_repeated_ones(tmp_path):
    tools = Tools(tmp_path, 10)
    (tmp_path / "m.py").write_text("a = 1\nb = 1\n")
    assert _call(tools, "edit", path="m.py", old_str="a = 1", new_str="a = 2") == ("edited m.py", True)
    assert (tmp_path / "m.py").read_text() == "a = 2\nb = 1\n"
    text, ok = _call(tools, "edit", path="m.py", old_str="zzz", new_str="y")
    assert not ok and "occurs 0 times" in text
    (tmp_path / "m.py").write_text("x\nx\n")
    text, ok = _call(tools, "edit", path="m.py", old_str="x", new_str="y")
    assert not ok and "occurs 2 times" in text and (tmp_path / "m.py").read_text() == "x\nx\n"


def test_file_tools_report_errors_to_the_model_instead_of_raising(tmp_path):
    tools = Tools(tmp_path, 10)
    assert _call(tools, "write_file", path="pkg/new.py", content="v = 1\n") == ("wrote 6 characters to pkg/new.py", True)
    assert _call(tools, "read_file", path="pkg/new.py") == ("v = 1\n", True)
    for name, args, expect in [("read_file", {"path": "nope.py"}, "cannot read nope.py"),
                               ("read_file", {"path": ""}, "path must be"),
                               ("read_file", {"query": "x"}, "bad arguments"),  # what the tiny model sends
                               ("write_file", {"path": "pkg/new.py/x", "content": "1"}, "cannot write"),
                               ("lookup", {"query": "x"}, "unknown tool 'lookup'")]:
        text, ok = _call(tools, name, **args)
        assert not ok and expect in text, (name, text)
    (tmp_path / "bin.dat").write_bytes(b"\xff\xfe\x00")
    assert "not a UTF-8 text file" in _call(tools, "read_file", path="bin.dat")[0]
    broken = ToolCall("c2", "bash", '{"command": ', None, "arguments are not valid JSON (x)")
    assert run_tool(broken, tools.table()) == ("Error: arguments are not valid JSON (x).", False)


def test_bash_reports_the_exit_code_and_kills_a_command_tree_at_its_timeout(tmp_path):
    tools = Tools(tmp_path, 1)
    out, ok = _call(tools, "bash", command="echo hi; exit 3")
    assert ok and out == "hi\n\n[exit code 3]"
    started = time.monotonic()
    out, ok = _call(tools, "bash", command="sleep 30 & sleep 30; echo never")
    assert ok and "[killed after 1 s]" in out and "never" not in out and time.monotonic() - started < 10


def test_long_output_keeps_its_head_and_its_tail():
    text = "H" * 3000 + "M" * 20000 + "T" * 7000
    cut = clip(text)
    assert len(cut) < OUTPUT_LIMIT + 100 and cut.startswith("H" * 2000) and cut.endswith("T" * 6000)
    assert "characters cut" in cut


# ---- the command line ------------------------------------------------------------------------

@pytest.mark.parametrize("content, message", [
    (None, "cannot read the task file"),
    ("not json", "is not JSON"),
    ('{"id": "t"}', "no task statement"),
])
def test_a_bad_task_file_is_one_line_and_exit_2(tmp_path, content, message):
    task = tmp_path / "task.json"
    if content is not None:
        task.write_text(content)
    got = subprocess.run([*AGENT, str(task)], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    assert got.returncode == 2 and message in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1 and "Traceback" not in got.stderr


def test_an_unreachable_proxy_is_one_line_and_a_failed_run(tmp_path):
    task = tmp_path / "task.json"
    task.write_text('{"id": "t", "input": "fix it"}')
    got = subprocess.run([*AGENT, str(task)], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "k"})
    assert got.returncode == 2 and "cannot reach the proxy" in got.stderr and "Traceback" not in got.stderr


# ---- whole runs through the proxy ------------------------------------------------------------

@pytest.fixture(scope="module")
def scripted_proxy(tokenizer_dir, tmp_path_factory):
    """The proxy (prefix mode) over the scripted stand-in, which fixes task 0 and only touches
    task 1 (a comment appended; tests/coding_edits.py)."""
    from vllm_standin import create_app, run_standin

    from harnessrl.proxy.config import ProxyConfig
    from harnessrl.proxy.server import run_proxy

    train, _ = generate(2, 0, seed=3)
    assert needle(train[0]) != needle(train[1])
    commands = ((needle(train[0]), fix_command(train[0])), (needle(train[1]), wrong_command(train[1])))
    app = create_app(str(tokenizer_dir), scripted=True, served=("hrl-scripted",), commands=commands)
    db = tmp_path_factory.mktemp("agent") / "runs.db"
    with run_standin(str(tokenizer_dir), app) as upstream, \
            run_proxy(ProxyConfig(db=str(db), upstream=upstream, prefix=True, tokenizer=str(tokenizer_dir),
                                  port=0)) as proxy:
        yield proxy.url, train, db


def _run_agent(proxy_url: str, row: dict, work: Path) -> subprocess.CompletedProcess:
    for rel, text in row["workspace"].items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    task = work.parent / f"{row['id']}.json"
    task.write_text(json.dumps({"id": row["id"], "input": row["input"]}))
    return subprocess.run([sys.executable, "-m", "harnessrl", "run", "--proxy", proxy_url, "--no-intercept",
                           "--task", row["id"], "--reward-from", "exit-code", "--", *AGENT, str(task)],
                          capture_output=True, text=True, cwd=work, timeout=120)


def _pytest(work: Path) -> int:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=work,
                          capture_output=True, text=True).returncode


def test_the_agent_applies_a_scripted_fix_through_its_bash_tool_and_the_tests_pass(scripted_proxy, tmp_path):
    url, train, _ = scripted_proxy
    work = tmp_path / "ws"
    assert _pytest_after_workspace(train[0], work) != 0  # the task starts broken
    got = _run_agent(url, train[0], work)
    assert got.returncode == 0, got.stderr[-2000:]
    report = json.loads(got.stdout.strip().splitlines()[-1])
    assert report == {"stopped": "answer", "model_calls": 2, "tool_calls": 1, "tool_errors": 0}
    assert _pytest(work) == 0


def test_a_scripted_edit_that_does_not_fix_leaves_the_tests_failing(scripted_proxy, tmp_path):
    url, train, _ = scripted_proxy
    work = tmp_path / "ws"
    got = _run_agent(url, train[1], work)
    assert got.returncode == 0, got.stderr[-2000:]
    (path, _), = train[1]["reference"].items()
    assert (work / path).read_text().endswith("# looked at it\n")  # the edit ran
    assert _pytest(work) != 0


def test_every_agent_call_is_recorded_ok_and_the_tool_turn_extends_the_first(scripted_proxy, tmp_path):
    from sqlalchemy import select

    from harnessrl.db import open_db
    from harnessrl.records import Call, Rollout

    url, train, db = scripted_proxy
    got = _run_agent(url, train[0], tmp_path / "ws")
    assert got.returncode == 0, got.stderr[-2000:]
    rollout = got.stderr.split("harnessrl run: rollout ")[1].split()[0]
    _, Session = open_db(str(db))
    with Session() as s:
        calls = list(s.scalars(select(Call).where(Call.rollout_id == rollout).order_by(Call.seq)))
        assert s.get(Rollout, rollout) is not None
    assert [c.status for c in calls] == ["ok", "ok"] and all(c.prompt_ids and c.completion_ids for c in calls)
    assert [t["function"]["name"] for t in calls[0].request["tools"]] == ["bash", "read_file", "write_file", "edit"]
    assert calls[1].prompt_path == "prefix" and calls[1].prefix_call_id == calls[0].id


def _pytest_after_workspace(row: dict, work: Path) -> int:
    for rel, text in row["workspace"].items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    return _pytest(work)
