"""One coding rollout end to end on the real parts: the tiny model behind a real proxy, a real
sandbox (bubblewrap), a fresh workspace, the hidden tests run by real pytest, the reward and its
test output in the records DB and on the viewer's rollout page. The harness is a small script
(an edit it is told to make, one model call through the sandbox's relay); `loop --cmd`'s runner
(`cmd_harness`'s `run`) and `harnessrl run` drive it."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from harnessrl.app.rollouts.cmd_harness import cmd_harness
from harnessrl.app.rollouts.harnesses import TaskSource
from harnessrl.app.rollouts.limited_run import RolloutFlags
from harnessrl.db import open_db
from harnessrl.harness_examples.coding.tasks import HIDDEN, VISIBLE, write
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Reward, Rollout
from harnessrl.tasks_file import read_tasks
from harnessrl.viewer.app import create_viewer

sys.path.insert(0, str(Path(__file__).parent))
from viewer_fixtures import serve  # noqa: E402

N_HIDDEN = VISIBLE + HIDDEN  # the hidden tests repeat the visible cases
pytestmark = pytest.mark.skipif(not Path("/usr/bin/bwrap").exists(), reason="bubblewrap is not installed")

# The harness: one model call (through the base URL it was given), then what `mode` says.
AGENT = """
import json, os, sys, time
import openai
mode, edit_file, task_file = sys.argv[1:4]
task = json.load(open(task_file))
client = openai.OpenAI(max_retries=0)  # base URL and key from the variables the rollout sets
if mode == "refused":
    try:
        client.chat.completions.create(model="m", messages="not a list")
    except openai.BadRequestError:
        pass
client.chat.completions.create(model="m", max_tokens=3, messages=[{"role": "user", "content": task["input"]}])
if mode == "plant":  # a passing test where the hidden ones go, and no fix
    os.makedirs("hidden_tests", exist_ok=True)
    open("hidden_tests/test_planted.py", "w").write("def test_ok():\\n    assert True\\n")
    sys.exit(0)
if mode != "nothing":
    for path, text in json.load(open(edit_file)).items():
        open(path, "w").write(text)
if mode == "crash":
    sys.exit(3)
if mode == "sleep":
    time.sleep(60)
"""


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("coding")
    files = write(root / "tasks", 2, 0, seed=5)
    rows = read_tasks(files["all"])
    agent = root / "agent.py"
    agent.write_text(AGENT)
    edits = root / "edits"
    edits.mkdir()
    for row in rows:
        (edits / f"{row.id}.json").write_text(json.dumps(row.reference))
    db = root / "runs.db"
    with run_proxy(ProxyConfig(db=str(db), backend="local", model=str(tiny_model_dir), port=0)) as proxy:
        yield {"url": proxy.url, "db": db, "tasks": files["all"], "rows": rows, "agent": agent, "edits": edits,
               "root": root}


def _runner(s, mode: str, flags: RolloutFlags, task_index: int = 0):
    src = TaskSource(s["tasks"], None, s["root"] / f"out-{mode}", 8, 0.0, 0)
    task = s["rows"][task_index]
    template = f"{sys.executable} {s['agent']} {mode} {s['edits'] / (task.id + '.json')} {{task}}"
    h = cmd_harness(template, src, None, False, flags)
    return h.run(s["url"], task, f"g-{mode}", f"run-{mode}", 1.0)


def _rollout(db: Path, rollout_id: str) -> tuple[Rollout, list[Reward]]:
    with open_db(str(db))[1]() as s:
        ro = s.get(Rollout, rollout_id)
        return ro, list(s.scalars(select(Reward).where(Reward.rollout_id == rollout_id)))


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_a_fix_passes_the_hidden_tests_and_gets_reward_1(setup, sandbox):
    result = _runner(setup, "fix", RolloutFlags(sandbox=sandbox, timeout=120))
    assert result.error is None and result.outcome == 1.0
    ro, rewards = _rollout(setup["db"], result.rollout_id)
    assert ro.status == "finished" and ro.next_seq == 1  # the model call went through (the relay, in a sandbox)
    [reward] = rewards
    assert (reward.kind, reward.name, reward.value) == ("outcome", "tests", 1.0)
    meta = reward.meta
    assert meta["passed"] == N_HIDDEN and meta["failed"] == meta["errors"] == 0
    assert f"{N_HIDDEN} passed" in meta["output"]
    assert result.metrics["success"] == 1.0 and result.metrics["tests_total"] == N_HIDDEN


def test_no_fix_scores_the_pass_fraction_or_all_pass(setup):
    """The bug task without a fix: some hidden cases pass, some fail."""
    fraction = _runner(setup, "nothing", RolloutFlags(timeout=120))
    all_pass = _runner(setup, "nothing", RolloutFlags(timeout=120, reward_mode="all-pass"))
    _, [reward] = _rollout(setup["db"], fraction.rollout_id)
    assert 0 < reward.meta["passed"] < N_HIDDEN and reward.meta["failed"] == N_HIDDEN - reward.meta["passed"]
    assert fraction.outcome == pytest.approx(reward.meta["passed"] / N_HIDDEN) and fraction.error is None
    assert all_pass.outcome == 0.0 and all_pass.error is None and all_pass.metrics["success"] == 0.0


def test_tests_planted_in_the_workspace_do_not_count(setup):
    """The missing-function task: the agent's own hidden_tests/ is replaced by the real ones."""
    result = _runner(setup, "plant", RolloutFlags(timeout=120), task_index=1)
    _, [reward] = _rollout(setup["db"], result.rollout_id)
    assert result.outcome == 0.0 and reward.meta["failed"] == N_HIDDEN and "test_planted" not in reward.meta["output"]


@pytest.mark.parametrize("mode, flags", [("crash", RolloutFlags(timeout=120)), ("sleep", RolloutFlags(timeout=4))])
def test_a_crash_or_a_timeout_is_scored_on_what_the_harness_left(setup, mode, flags):
    """With the fix in place: a harness's own end is no escape from its score, nor a way to lose a
    good one (docs/coding.md, issue 54); the rollout is finished, not failed."""
    result = _runner(setup, mode, flags)
    assert result.error is None and result.outcome == 1.0, result
    ro, [reward] = _rollout(setup["db"], result.rollout_id)
    assert ro.status == "finished" and reward.value == 1.0
    assert reward.meta["harness"]["timed_out"] is (mode == "sleep") and reward.meta["harness"]["exit_code"] != 0


def test_refused_calls_keep_the_tests_reward_and_are_reported(setup):
    result = _runner(setup, "refused", RolloutFlags(timeout=120))
    ro, [reward] = _rollout(setup["db"], result.rollout_id)
    assert (ro.status, ro.errors, reward.value) == ("finished", 1, 1.0)  # compile drops it: --on-call-error
    assert result.outcome == 1.0 and result.error == "1 call refused by the proxy, see " + result.error.split("see ")[1]


def test_harnessrl_run_runs_one_task_and_the_viewer_shows_the_test_output(setup, tmp_path):
    task = setup["rows"][1]
    edit = setup["edits"] / f"{task.id}.json"
    base = [sys.executable, "-m", "harnessrl", "run", "--proxy", setup["url"], "--no-intercept",
            "--tasks", str(setup["tasks"]), "--task", task.id, "--"]
    done = subprocess.run(base + [sys.executable, str(setup["agent"]), "fix", str(edit), str(tmp_path / "t.json")],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path, env=_with_task_file(tmp_path, task))
    assert done.returncode == 0, done.stderr
    assert "outcome 1" in done.stderr
    fixed = done.stderr.split("harnessrl run: rollout ", 1)[1].split()[0]
    crashed = subprocess.run(base + [sys.executable, str(setup["agent"]), "crash", str(edit), str(tmp_path / "t.json")],
                             capture_output=True, text=True, timeout=180, cwd=tmp_path, env=_with_task_file(tmp_path, task))
    assert crashed.returncode == 3 and "outcome 1" in crashed.stderr  # scored on what it left, exit code kept
    crashed_id = crashed.stderr.split("harnessrl run: rollout ", 1)[1].split()[0]
    with serve(create_viewer(str(setup["db"]))) as url:
        page = html.unescape(httpx.get(f"{url}/rollouts/{fixed}").text)
        assert f"{N_HIDDEN} passed" in page and "tests" in page and '"mode": "pass-fraction"' in page
        assert httpx.get(f"{setup['url']}/harnessrl/rollouts/{fixed}").json()["status"] == "finished"  # scored: not left open
        page = html.unescape(httpx.get(f"{url}/rollouts/{crashed_id}").text)
        assert f"{N_HIDDEN} passed" in page and '"exit_code": 3' in page


def _with_task_file(folder: Path, task) -> dict:
    (folder / "t.json").write_text(json.dumps({"id": task.id, "input": task.input}))
    return dict(os.environ)
