"""Scoring is total and a harness's own end is no escape (issue 54, items 3 and 4).

Whatever comes out of a sandbox is hostile data: a report written to break the host's parser, a
file name that is not UTF-8, a report whose fields have the wrong types. Each is scored (the
policy's 0 at most, the reason in the reward's metadata), the reward is posted, and the rollout is
never `failed` nor left without an outcome. A harness that exits non-zero, kills itself or runs
past its timeout still has its workspace scored. A runner that raises does not end the loop: the
executor counts it as a failed rollout. The end-to-end cases go through `loop --cmd`'s runner
with a real proxy (no model is called) under bubblewrap."""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
from pathlib import Path

import pytest

from harnessrl.app.rollouts.cmd_harness import cmd_harness
from harnessrl.app.rollouts.executors import LocalExecutor, run_batch
from harnessrl.app.rollouts.harnesses import TaskSource
from harnessrl.app.rollouts.jobs import Job
from harnessrl.app.rollouts.limited_run import RolloutFlags, coding_tasks
from harnessrl.app.scoring import hostile
from harnessrl.app.scoring.hidden_tests import _read_report
from harnessrl.errors import UserError
from harnessrl.harness_examples.coding.tasks import write
from harnessrl.tasks_file import read_tasks

BWRAP = pytest.mark.skipif(not Path("/usr/bin/bwrap").exists(), reason="bubblewrap is not installed")


def _posted(meta) -> bytes:
    """What httpx sends for a reward's metadata: strict JSON, UTF-8, no NaN."""
    return json.dumps(meta, ensure_ascii=False, allow_nan=False).encode("utf-8")


@pytest.mark.unit
def test_hostile_json_is_one_error_and_metadata_always_encodes():
    for raw, why in ((b"[" * 100_000 + b"]" * 100_000, "deeper"), (b"\xff\xfe{}", "UTF-8"), (b"{" * 3, "JSON"),
                     (b"1" * 2000, "larger")):
        with pytest.raises(hostile.HostileData, match=why):
            hostile.loads(raw, 1000 if why == "larger" else 1 << 20)
    assert hostile.loads('{"a": "[[[["}', 100, max_depth=2) == {"a": "[[[["}  # brackets in a string do not nest
    name = b"pkg/\xff\xfe.py".decode("utf-8", "surrogateescape")
    with pytest.raises(UnicodeEncodeError):
        _posted({"left_out": [name]})
    meta = hostile.safe_meta({"left_out": [name], name: float("nan"), "x": json.loads('"\\ud800"')})
    assert _posted(meta) and meta["left_out"] == ["pkg/\\udcff\\udcfe.py"] and meta["pkg/\\udcff\\udcfe.py"] == "nan"


def _signed(key: bytes, payload) -> bytes:
    text = json.dumps(payload)
    return json.dumps({"payload": text, "mac": hmac.new(key, text.encode(), hashlib.sha256).hexdigest()}).encode()


@pytest.mark.unit
@pytest.mark.parametrize("raw", [
    b"[" * 200_000 + b"]" * 200_000,  # Python's parser recursed past its limit: RecursionError
    b'{"payload": 5, "mac": []}', b'{"payload": "x", "mac": 7}', b'[1, 2]', b'"text"', b"\xff" * 10,
    b'{"payload": "\\ud800", "mac": "\\ud800"}',
    "signed: collected of lists", "signed: outcomes of lists", "signed: exitstatus true", "signed: a list",
])
def test_a_report_of_any_shape_reads_as_unreadable_never_an_exception(tmp_path, raw):
    key = b"k" * 32
    if isinstance(raw, str):  # a report signed with the stolen key, its fields of the wrong types
        base = {"exitstatus": 0, "collected": ["t"], "outcomes": {"t": {"call": "passed"}}}
        raw = _signed(key, {"signed: collected of lists": {**base, "collected": [["t"]]},
                            "signed: outcomes of lists": {**base, "outcomes": {"t": ["passed"]}},
                            "signed: exitstatus true": {**base, "exitstatus": True},
                            "signed: a list": [base]}[raw])
    (tmp_path / "r").write_bytes(raw)
    assert _read_report(tmp_path, "r", key) == (None, "unreadable")


@pytest.mark.unit
def test_a_runner_that_raises_is_a_failed_rollout_and_the_batch_goes_on():
    def runner(url, task, group_id, run_tag, temperature):
        if task % 2:
            raise UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed")
        return task * 10

    jobs = [Job(i, str(i), "g", "r", 1.0) for i in range(4)]
    results = run_batch(LocalExecutor(2, None), runner, "http://x", jobs, "t")
    assert results[0] == 0 and results[2] == 20
    for r in (results[1], results[3]):
        assert r.rollout_id == "" and r.error.startswith("the rollout raised UnicodeEncodeError"), r

    def config_error(*_):
        raise UserError("--cmd: no such program")
    with pytest.raises(UserError, match="no such program"):  # the user's to fix: one line, as before
        run_batch(LocalExecutor(1, None), config_error, "http://x", jobs[:1], "t")


# End to end: the harness's own end, and hostile data out of the sandbox
AGENT = r"""
import json, os, signal, sys, time
mode, task_file, fix = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
pkg = next(iter(fix)).split("/")[0]
if mode.startswith("fix"):
    for path, text in fix.items():
        open(path, "w").write(text)
if mode == "badname":  # a file name that is not UTF-8, in the package and in a folder left out
    os.close(os.open(pkg.encode() + b"/\xff\xfe.py", os.O_CREAT | os.O_WRONLY))
    os.makedirs(pkg.encode() + b"/\xff/conftest.py", exist_ok=True)
if mode == "deep-report":  # the code under test writes a report the host's parser choked on
    open(pkg + "/__init__.py", "w").write('''
import os
for fd in os.listdir("/proc/self/fd"):
    try:
        if "/.score-" in os.readlink(f"/proc/self/fd/{fd}"):
            os.write(int(fd), b"[" * 300000 + b"]" * 300000)
    except OSError:
        pass
os._exit(1)
''')
if mode == "half":  # the loop's case: every other task's rollouts attack, in every way at once
    if sys.argv[4] == "1":  # the job's temperature picks the attackers
        os.close(os.open(pkg.encode() + b"/\xff.py", os.O_CREAT | os.O_WRONLY))
        open(pkg + "/__init__.py", "w").write("import os\nos.write(1, b'x' * (8 << 20))\nos._exit(3)\n")
        os.kill(os.getpid(), signal.SIGKILL)
if mode == "fix-crash":
    sys.exit(3)
if mode == "fix-sleep":
    time.sleep(120)
if mode == "fix-killself":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "fix-killall":  # every process of its sandbox, the launcher too: nothing is handed back
    os.kill(-1, signal.SIGKILL)
    time.sleep(5)
"""


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    root = tmp_path_factory.mktemp("total")
    out = {}
    for hidden in ("calls", "pytest"):  # the generated family's data tests, and a task of pytest files
        files = write(root / hidden, 1, 0, seed=0, salt="integrity", hidden=hidden)
        [row] = read_tasks(files["all"])
        coding_tasks([row], files["all"], RolloutFlags())  # the known tests, cached
        out[hidden] = {"files": files, "row": row}
    (root / "agent.py").write_text(AGENT)
    with run_proxy(ProxyConfig(db=str(root / "runs.db"), upstream="http://127.0.0.1:9", port=0)) as proxy:
        yield {"url": proxy.url, "root": root, **out}


def _rollout(live, mode: str, timeout: float = 120, sandbox: str = "bwrap", hidden: str = "calls"):
    root, row, files = live["root"], live[hidden]["row"], live[hidden]["files"]
    src = TaskSource(files["all"], None, root / f"out-{mode}-{hidden}", 8, 0.0, 0)
    fix = json.dumps(row.reference).replace("'", "'\\''")
    template = f"{sys.executable} {root / 'agent.py'} {mode} {{task}} '{fix}'"
    h = cmd_harness(template, src, None, False, RolloutFlags(sandbox=sandbox, timeout=timeout))
    result = h.run(live["url"], row, f"g-{mode}", f"run-{mode}-{sandbox}-{hidden}", 1.0)
    from harnessrl.client import HarnessRL

    with HarnessRL(live["url"]) as client:
        ro = client.get_rollout(result.rollout_id)
    return result, ro


@BWRAP
@pytest.mark.parametrize("hidden", ["pytest", "calls"])
def test_hostile_names_and_reports_are_scored_and_posted(live, hidden):
    nothing, _ = _rollout(live, "nothing", hidden=hidden)
    assert nothing.error is None and 0 < nothing.outcome < 1
    for mode in ("badname", "deep-report"):
        result, ro = _rollout(live, mode, hidden=hidden)
        assert result.error is None and result.outcome is not None and result.outcome <= nothing.outcome, result
        [reward] = [r for r in ro["rewards"] if r["kind"] == "outcome"]
        assert ro["status"] == "finished" and reward["value"] == result.outcome
        if mode == "badname":
            assert any("\\udcff" in line for line in reward["metadata"]["left_out"]), reward["metadata"]
        elif hidden == "pytest":  # the report the parser choked on: unreadable, the policy's 0
            assert result.outcome == 0.0 and "unreadable" in reward["metadata"]["zero"], reward["metadata"]
        else:  # the answers file it wrote into: no case answered
            assert result.outcome == 0.0 and "case0 failed: no answer" in reward["metadata"]["output"]


@BWRAP
@pytest.mark.parametrize("mode, timeout", [("fix-crash", 120), ("fix-killself", 120), ("fix-sleep", 4)])
def test_a_harness_that_crashes_kills_itself_or_times_out_is_scored_on_what_it_left(live, mode, timeout):
    result, ro = _rollout(live, mode, timeout)
    assert result.error is None and result.outcome == 1.0 and ro["status"] == "finished", (result, ro["status"])
    [reward] = [r for r in ro["rewards"] if r["kind"] == "outcome"]
    harness = reward["metadata"]["harness"]
    assert harness["timed_out"] is (mode == "fix-sleep") and harness["exit_code"] != 0, harness


@BWRAP
def test_a_harness_that_kills_its_whole_sandbox_scores_what_doing_nothing_scores(live):
    nothing, _ = _rollout(live, "nothing")
    result, ro = _rollout(live, "fix-killall")
    assert result.error is None and ro["status"] == "finished" and result.outcome == nothing.outcome, result


def test_without_a_sandbox_a_timeout_is_scored_on_what_it_left(live):
    result, ro = _rollout(live, "fix-sleep", 4, sandbox="none")
    assert result.error is None and result.outcome == 1.0 and ro["status"] == "finished", result


@BWRAP
def test_a_batch_with_half_its_rollouts_attacking_runs_to_its_end_all_scored(live, tmp_path):
    """What `harnessrl loop` runs each step: the executor's batch, half of its rollouts attacking
    (an undecodable name, output past the cap, an exit at import, a harness that kills itself; the
    job's temperature picks them). Every rollout is scored; none fails, none raises."""
    row = live["pytest"]["row"]
    src = TaskSource(live["pytest"]["files"]["all"], None, tmp_path / "out", 8, 0.0, 0)
    fix = json.dumps(row.reference).replace("'", "'\\''")
    h = cmd_harness(f"{sys.executable} {live['root'] / 'agent.py'} half {{task}} '{fix}' {{temperature}}", src, None,
                    False, RolloutFlags(sandbox="bwrap", timeout=120))
    jobs = [Job(row, row.id, "g-half", "run-half", temperature) for temperature in (1.0, 0.5, 1.0, 0.5)]
    results = run_batch(LocalExecutor(2, 300), h.run, live["url"], jobs, "half")
    assert all(r.error is None and r.outcome is not None for r in results), results
    nothing, _ = _rollout(live, "nothing", hidden="pytest")
    assert [r.outcome for r in results] == [0.0, nothing.outcome, 0.0, nothing.outcome], results


@pytest.mark.ray
def test_under_ray_a_runner_that_raises_is_a_failed_rollout_and_the_batch_goes_on():
    from harnessrl.app.rollouts.ray_rollouts import RayExecutor

    def _raising_runner(url, task, group_id, run_tag, temperature):  # nested: Ray ships it by value
        if task % 2:
            raise ValueError("a rollout's own fault")
        return task * 10

    ex = RayExecutor(None, 2, 120)
    try:
        results = run_batch(ex, _raising_runner, "http://x", [Job(i, str(i), "g", "r", 1.0) for i in range(4)], "t")
    finally:
        ex.close()
    assert results[0] == 0 and results[2] == 20
    assert all(r.rollout_id == "" and r.error.startswith("the rollout raised ValueError") for r in results[1::2])


@BWRAP
@pytest.mark.parametrize("mode", ["badname", "deep-report", "fix-killself"])
def test_harnessrl_run_scores_each_and_never_exits_with_a_traceback(live, tmp_path, mode):
    """The issue's first symptom: `harnessrl run` exited 1 with a traceback on a report the parser
    could not read, and on a name that is not UTF-8."""
    import subprocess

    row, files = live["pytest"]["row"], live["pytest"]["files"]
    done = subprocess.run([sys.executable, "-m", "harnessrl", "run", "--proxy", live["url"], "--no-intercept",
                           "--tasks", str(files["all"]), "--task", row.id, "--",
                           sys.executable, str(live["root"] / "agent.py"), mode, "-", json.dumps(row.reference)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "Traceback" not in done.stderr and "outcome " in done.stderr, done.stderr[-2000:]
    assert done.returncode == (137 if mode == "fix-killself" else 0), done.stderr[-2000:]
