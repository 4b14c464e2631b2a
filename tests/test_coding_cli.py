"""Real coding CLIs on the coding tasks, unmodified: Claude Code, Codex, OpenCode and
mini-swe-agent, each under `harnessrl run --tasks FILE --task ID` (a fresh workspace, the
bubblewrap sandbox, the hidden tests as the reward, all-pass) against the proxy (prefix mode) over
the scripted vLLM stand-in. The scripted model makes an edit through the harness's own shell tool
(tests/coding_edits.py): the edit that fixes the bug must be rewarded 1, the one that does not 0.
One harness alone: `pytest tests/test_coding_cli.py -k codex`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import harness_cli as hc
import pytest
from coding_edits import fix_command, needle, wrong_command

from harnessrl.harness_examples.coding.tasks import generate

pytestmark = pytest.mark.harness
MODEL = hc.MODEL


def _argv(name: str, statement: str) -> list[str]:
    """Each harness's non-interactive command, given the task statement as its prompt."""
    program = str(hc.program(name))
    return {
        "claude-code": [program, "-p", statement, "--allowedTools", "Bash"],
        # the sandbox is harnessrl's: Codex's own cannot nest in it; the workspace is no git repository
        "codex": [program, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", statement],
        "opencode": [program, "run", statement],
        "mini-swe-agent": [program, "-m", f"openai/{MODEL}", "-t", statement, "-y", "--exit-immediately"],
    }[name]


NAMES = ("claude-code", "codex", "opencode", "mini-swe-agent")


def _pick(rows: list[dict]) -> tuple[dict, dict]:
    """Two tasks of different modules whose fix is among the shortest (the scripted reply holds
    it: shorter replies are quicker to stream through every surface)."""
    ranked = sorted(rows, key=lambda r: len(fix_command(r)))
    first = ranked[0]
    second = next(r for r in ranked[1:] if needle(r) != needle(first) and
                  next(iter(r["reference"])) != next(iter(first["reference"])))
    return first, second


@pytest.fixture(scope="module")
def served(tokenizer_dir, tmp_path_factory):
    """The tasks file (one task to fix, one to get wrong) and the proxy over the scripted stand-in."""
    from vllm_standin import create_app, run_standin

    from harnessrl.proxy.config import ProxyConfig
    from harnessrl.proxy.server import run_proxy

    if (reason := hc.netns_reason()) is not None:  # bubblewrap needs the same user namespaces
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("coding-cli")
    train, _ = generate(12, 0, seed=0)
    fixed, missed = _pick(train)
    tasks = out / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in (fixed, missed)))
    commands = ((needle(fixed), fix_command(fixed)), (needle(missed), wrong_command(missed)))
    app = create_app(str(tokenizer_dir), scripted=True, served=(MODEL,), commands=commands)
    # harnesses that send no max_tokens get the proxy's default: room for the scripted edit
    # (the tiny tokenizer spends about a token per character on code)
    with run_standin(str(tokenizer_dir), app) as upstream, \
            run_proxy(ProxyConfig(db=str(out / "runs.db"), upstream=upstream, prefix=True,
                                  tokenizer=str(tokenizer_dir), default_max_tokens=1024, port=0)) as proxy:
        yield {"url": proxy.url, "db": out / "runs.db", "tasks": tasks, "fixed": fixed, "missed": missed, "out": out}


def _run(served: dict, name: str, row: dict, label: str) -> dict:
    """One rollout of the harness on the task, in the environment a user's would have: a fresh
    HOME, the fake keys, the harness's default configuration."""
    hc.require(name)
    out = served["out"] / f"{name}-{label}"
    (out / "home").mkdir(parents=True)
    keep = {k: os.environ[k] for k in ("PATH", "LANG") if k in os.environ}
    env = {**keep, "HOME": str(out / "home"), "TERM": "dumb", "NO_COLOR": "1", **hc.KEYS, **hc.HARNESSES[name].env,
           "HARNESSRL_HOME": str(out / "hrl-home")}
    argv = [sys.executable, "-m", "harnessrl", "run", "--proxy", served["url"], "--tasks", str(served["tasks"]),
            "--task", row["id"], "--run", f"{name}-{label}", "--reward-mode", "all-pass", "--no-intercept", "--",
            *_argv(name, row["input"])]
    started = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=out, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)
    seconds = time.monotonic() - started
    found = re.search(r"harnessrl run: rollout (\S+)", proc.stderr)
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr, "seconds": round(seconds, 1),
            "rollout": found.group(1) if found else None}


def _records(served: dict, rollout: str):
    from sqlalchemy import select

    from harnessrl.db import open_db
    from harnessrl.records import Call, Reward, Rollout

    _, Session = open_db(str(served["db"]))
    with Session() as s:
        ro = s.get(Rollout, rollout)
        calls = list(s.scalars(select(Call).where(Call.rollout_id == rollout).order_by(Call.seq)))
        rewards = list(s.scalars(select(Reward).where(Reward.rollout_id == rollout, Reward.kind == "outcome")))
        s.expunge_all()
    return ro, calls, rewards


def _explain(r: dict) -> str:
    return f"exit {r['rc']} in {r['seconds']} s\n--- stdout\n{r['stdout'][-2000:]}\n--- stderr\n{r['stderr'][-3000:]}"


@pytest.mark.parametrize("name", NAMES)
def test_a_fixing_edit_is_rewarded_1_and_a_wrong_edit_0(served, name):
    times = {}
    for label, row, expected in (("fix", served["fixed"], 1.0), ("wrong", served["missed"], 0.0)):
        r = _run(served, name, row, label)
        times[label] = r["seconds"]
        assert r["rc"] == 0 and r["rollout"], _explain(r)
        ro, calls, rewards = _records(served, r["rollout"])
        assert ro.status == "finished" and not (ro.meta or {}).get("error"), (ro.status, ro.meta, _explain(r))
        assert calls and all(c.status == "ok" and c.prompt_ids and c.completion_ids for c in calls), \
            [(c.seq, c.status, c.error) for c in calls]
        # the scripted edit went through the harness's shell tool: its marker came back in a later call
        assert any("hrl-tool-ran" in json.dumps(c.request.get("messages")) for c in calls), _explain(r)
        assert [w.value for w in rewards] == [expected], (label, [(w.value, w.meta) for w in rewards], _explain(r))
        meta = rewards[0].meta or {}
        total = meta.get("passed", 0) + meta.get("failed", 0) + meta.get("errors", 0)
        assert total > 0 and (meta["failed"] + meta.get("errors", 0) == 0) == (expected == 1.0), meta
        assert re.search(r"\d+ (passed|failed)", meta.get("output", "")), meta  # pytest's summary, kept with the reward
    print(f"\n{name}: fix {times['fix']} s, wrong {times['wrong']} s")

