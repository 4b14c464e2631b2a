"""`harnessrl run --no-intercept`, `harnessrl reward` and `harnessrl loop --cmd` on the tiny model
(interception itself: tests/test_intercept.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from harnessrl.app.rollouts.cmd_harness import fill
from harnessrl.app.rollouts.command import outcome_of
from harnessrl.app.rollouts.intercept import find_mitmdump, read_hosts
from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, Reward, Rollout

HARNESSRL = [sys.executable, "-m", "harnessrl"]
# An external harness: reads the task file, calls the model at the base URL it is given, prints its outcome.
AGENT = """
import json, sys
import openai
task = json.load(open(sys.argv[1]))
client = openai.OpenAI(base_url=sys.argv[2], api_key="unused", max_retries=0)
reply = client.chat.completions.create(model="tiny", max_tokens=6, temperature=float(sys.argv[3]),
                                       messages=[{"role": "user", "content": "task " + task["id"] + ": " + task["input"]}])
print(json.dumps({"reward": len(reply.choices[0].message.content or "") % 3 / 2}))
"""


def _db(path: Path):
    return open_db(str(path))[1]


@pytest.fixture(scope="module")
def proxy(tiny_model_dir, tmp_path_factory):
    db = tmp_path_factory.mktemp("run") / "runs.db"
    with run_proxy(ProxyConfig(db=str(db), backend="local", model=str(tiny_model_dir), port=0)) as p:
        yield p.url, db


def _run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(HARNESSRL + list(args), capture_output=True, text=True, timeout=120, **kw)


def _rollout_id(stderr: str) -> str:
    return stderr.split("harnessrl run: rollout ", 1)[1].split()[0]


def _outcomes(db: Path, rollout: str) -> list[float]:
    with _db(db)() as s:
        return [r.value for r in s.scalars(select(Reward).where(Reward.rollout_id == rollout, Reward.kind == "outcome").order_by(Reward.id))]


def test_run_without_interception_sets_the_base_url_and_reports_the_exit_code(proxy, tmp_path):
    url, db = proxy
    script = tmp_path / "agent.py"
    script.write_text("import os, openai\n"
                      "c = openai.OpenAI()\n"  # base URL and key from the variables `harnessrl run` sets
                      "c.chat.completions.create(model='m', max_tokens=3, messages=[{'role': 'user', 'content': 'hi'}])\n"
                      "raise SystemExit(4)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    done = _run("run", "--proxy", url, "--no-intercept", "--agent", "solver", "--reward-from", "exit-code", "--",
                sys.executable, str(script), env=env)
    assert done.returncode == 4, done.stderr
    rollout = _rollout_id(done.stderr)
    with _db(db)() as s:
        assert s.get(Rollout, rollout).status == "finished"
        calls = list(s.scalars(select(Call).where(Call.rollout_id == rollout)))
    assert [(c.agent, c.status, bool(c.completion_ids)) for c in calls] == [("solver", "ok", True)]
    assert _outcomes(db, rollout) == [0.0]  # exit code 4


def test_reward_from_a_file_and_later_with_harnessrl_reward(proxy, tmp_path):
    url, db = proxy
    done = _run("run", "--proxy", url, "--no-intercept", "--reward-from", "file", "--",
                sys.executable, "-c", "import os; open(os.environ['HARNESSRL_REWARD_FILE'], 'w').write('0.75')")
    assert done.returncode == 0, done.stderr
    assert _outcomes(db, _rollout_id(done.stderr)) == [0.75]

    # no outcome source: the rollout stays running until `harnessrl reward` records it and finishes it
    graded_later = _run("run", "--proxy", url, "--no-intercept", "--", sys.executable, "-c", "pass")
    assert graded_later.returncode == 0 and "stays running for its outcome" in graded_later.stderr
    rollout = _rollout_id(graded_later.stderr)
    with _db(db)() as s:
        assert s.get(Rollout, rollout).status == "running"
    later = _run("reward", rollout, "0.5", "--proxy", url)
    assert later.returncode == 0, later.stderr
    assert _outcomes(db, rollout) == [0.5]
    with _db(db)() as s:
        assert s.get(Rollout, rollout).status == "finished"
    again = _run("reward", rollout, "0.9", "--proxy", url)  # a finished rollout takes no more rewards
    assert again.returncode == 2 and "is finished" in again.stderr and again.stderr.strip().count("\n") == 0
    assert _outcomes(db, rollout) == [0.5]
    missing = _run("reward", "no-such-rollout", "1", "--proxy", url)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_loop_cmd_runs_two_rounds_of_an_external_script_and_resumes(tiny_model_dir, tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"q{i}", "input": f"say {w}", "reference": w}) + "\n"
                             for i, w in enumerate(("red", "green", "blue"))))
    out = tmp_path / "loop"
    cmd = [*HARNESSRL, "loop", "--cmd", f"{sys.executable} agent.py {{task}} {{base_url}} {{temperature}}",
           "--tasks", str(tasks), "--reward-from", "stdout-json", "--model", str(tiny_model_dir), "--out", str(out),
           "--rounds", "2", "--group-size", "2", "--n-tasks", "2", "--eval-fraction", "0.5", "--steps", "1",
           "--batch-size", "2", "--concurrency", "4"]
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "loop_state.json").read_text())
    assert [r["round"] for r in state["rounds"]] == [0, 1] and state["attempts"] == 2
    with _db(out / "runs.db")() as s:
        for tag in ("round-0-a1", "round-1-a2"):
            rollouts = list(s.scalars(select(Rollout).where(Rollout.run == tag)))
            assert sorted(r.task_id for r in rollouts) == ["q0", "q0"]  # q1 is held out
            for r in rollouts:
                calls = list(s.scalars(select(Call).where(Call.rollout_id == r.id)))
                # the task file reached the program: its id and input are in the recorded prompt
                assert [c.request["messages"][0]["content"] for c in calls] == ["task q0: say red"]
                assert calls[0].completion_ids and r.status == "finished"
                assert len(_outcomes(out / "runs.db", r.id)) == 1
    assert state["rounds"][1]["samples"] > 0
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert again.returncode == 0 and "resuming after round 1" in again.stdout
    assert json.loads((out / "loop_state.json").read_text())["attempts"] == 2  # nothing ran again


@pytest.mark.unit
def test_placeholders_are_shell_quoted_and_other_braces_kept():
    line = fill("agent {task} --url {base_url} | awk '{print $1}'", {"task": "/tmp/a b.json", "base_url": "http://x"})
    assert line == "agent '/tmp/a b.json' --url http://x | awk '{print $1}'"


@pytest.mark.unit
def test_outcome_sources(tmp_path):
    assert outcome_of("exit-code", 0, None, None) == (1.0, None)
    assert outcome_of("exit-code", 1, None, None) == (0.0, None)
    assert outcome_of("stdout-json", 0, '{"reward": 0.7}', None) == (0.7, None)
    assert outcome_of("stdout-json", 0, "0.25", None) == (0.25, None)
    value, warning = outcome_of("stdout-json", 0, "done", None)
    assert value is None and "no reward" in warning
    assert outcome_of(None, 3, None, None) == (None, None)
    # nested past Python's parser (RecursionError, issue 54), lone surrogates: no reward, never a crash
    assert outcome_of("stdout-json", 0, "[" * 4000, None)[0] is None
    (tmp_path / "deep").write_text("[" * 4000)
    assert outcome_of(str(tmp_path / "deep"), 0, None, tmp_path / "deep")[0] is None
    assert outcome_of("stdout-json", 0, '{"reward": 0.5, "x": "\\ud800"}', None) == (0.5, None)
    (tmp_path / "r").write_text('{"reward": true}')  # a bool is not a reward
    assert outcome_of(str(tmp_path / "r"), 0, None, tmp_path / "r")[0] is None
    # the host never reads through what the command made: a link (to a file holding a reward the
    # command could not write) and a FIFO (a read that never ends) are no reward
    (tmp_path / "other").write_text("1.0")
    (tmp_path / "link").symlink_to(tmp_path / "other")
    value, warning = outcome_of(str(tmp_path / "link"), 0, None, tmp_path / "link")
    assert value is None and "holds no reward" in warning
    os.mkfifo(tmp_path / "fifo")
    assert outcome_of(str(tmp_path / "fifo"), 0, None, tmp_path / "fifo")[0] is None
    (tmp_path / "big").write_text("0.5" + " " * 10_000 + "9")  # read up to 4096 bytes: "0.5"
    assert outcome_of(str(tmp_path / "big"), 0, None, tmp_path / "big")[0] == 0.5


@pytest.mark.unit
def test_hosts_file_and_a_missing_mitmdump(tmp_path, monkeypatch):
    (tmp_path / "h.yaml").write_text("hosts: [LLM.corp.example, '*.gw.example']\n")
    assert read_hosts(tmp_path / "h.yaml") == ["llm.corp.example", "*.gw.example"]
    (tmp_path / "bad.json").write_text('{"a": 1}')
    with pytest.raises(UserError, match="expected a list"):
        read_hosts(tmp_path / "bad.json")
    with pytest.raises(UserError, match=r"scripts/install.sh.*HARNESSRL_MITMDUMP"):
        find_mitmdump(str(tmp_path / "nope"))


def test_a_loop_cmd_rollout_in_a_sandbox_sees_and_writes_only_its_own_reward_file(proxy, tmp_path):
    """`--reward-from file` under bwrap: the folder bound writable for the reward file is the
    rollout's own, so it holds no other rollout's log or reward file to read or overwrite."""
    from harnessrl.app.rollouts.cmd_harness import cmd_harness
    from harnessrl.app.rollouts.harnesses import TaskSource
    from harnessrl.app.rollouts.limited_run import RolloutFlags
    from harnessrl.tasks_file import read_tasks

    url, _ = proxy
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "q0", "input": "x", "reference": "y"}) + "\n")
    out = tmp_path / "out"
    # a group-mate's reward file where the old layout put it (beside the logs), and what this
    # rollout tries: list its reward folder, zero every reward file it can reach, report 0.5
    script = ('echo "entries $(ls -A "$(dirname "$HARNESSRL_REWARD_FILE")" | wc -l)"; '
              f'for f in {out}/cmd/logs/*/*.reward; do echo 0 2>/dev/null > "$f"; done; '
              'echo 0.5 > "$HARNESSRL_REWARD_FILE"; echo {task_id}')
    h = cmd_harness(script, TaskSource(tasks, None, out, 1, 0.0, 0), "file", False, RolloutFlags(sandbox="bwrap"))
    (out / "cmd" / "logs" / "r1").mkdir(parents=True)
    mate = out / "cmd" / "logs" / "r1" / "q0.0.reward"
    mate.write_text("1.0")
    result = h.run(url, read_tasks(tasks)[0], "g", "r1", 1.0)
    assert result.error is None and result.outcome == 0.5
    assert mate.read_text() == "1.0"  # the group-mate's file is out of reach
    log = next((out / "cmd" / "logs" / "r1").glob("*.log")).read_text()
    assert "entries 0" in log, log  # its reward folder held nothing, no log of its own or another's
