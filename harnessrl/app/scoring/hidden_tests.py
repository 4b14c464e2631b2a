"""A coding rollout's reward from its hidden tests, in a clean room, from a result the code under
test cannot write (docs/coding.md, "What the reward trusts").

- **Known tests.** When a task is loaded its hidden tests run once on the pristine workspace with
  the reference laid over it (`known_tests`): the node ids they collect, every one of which must
  pass, are the task's known tests (a task whose tests do not collect or do not pass on its
  reference is a one-line error then). A task without an inline reference is only collected.
  Cached in memory and in $XDG_CACHE_HOME/harnessrl/known-tests by the content of the task.
- **Clean room.** After the harness, a fresh copy of the pristine workspace gets the agent's
  solution surface (clean_room.py) and the hidden tests, and the tests run in a fresh sandbox
  under the rollout's limits: no route to the proxy, a fresh HOME and TMPDIR, an environment of
  PATH and LANG only (no key, no PYTHONPATH), the task files hidden as for the harness.
- **Signed result.** The runner (runner.py, `python -I -B`, explicit `-c`/`--rootdir`/
  `--confcutdir`, `-p no:cacheprovider`, no plugin autoload) reads a one-time key from a file it
  unlinks before pytest starts and writes per-test outcomes signed with it. The reward counts the
  known tests that passed every phase; a missing or badly signed report, an exit that is not
  pytest's own 0/1 or differs from the report's, or a test the task does not have scores 0 —
  the policy's zero, never a failed rollout. Skipped, deselected or uncollected tests are failed.

- **Canaries.** Beside the hidden test files, a canary file drawn when the task was loaded
  (canaries.py): its tests must fail, and a run in which one did not was tampered with: 0.
- **Data tests.** A task whose hidden tests are `hidden_tests/calls.json` is scored by calls.py
  instead: no pytest, no report, no key in the agent's reach.
- **Total.** Whatever the agent left makes a score; only the scorer's own fault (`ScorerFault`)
  leaves `score_rollout`.

A task's own `reward_cmd` (or `--reward-cmd`) runs in the same clean room and fresh sandbox, but
its reward is read from its output as before (workspace.score): that command is the user's to trust.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from importlib.metadata import version
from pathlib import Path, PurePosixPath
from typing import Any

from harnessrl.app.sandbox.run import ROOT, Finished, Limits
from harnessrl.app.scoring import calls, canaries, hostile
from harnessrl.app.scoring.clean_room import HIDDEN_DIR, SurfaceError, fresh_dir, take_surface
from harnessrl.app.scoring.sandboxed import ScorerFault, clean_env, read_back, run_sandboxed
from harnessrl.app.scoring.workspace import OUTPUT_KEPT, CodingTask, TestOutcome, lay, score
from harnessrl.errors import UserError

RUNNER = Path(__file__).with_name("runner.py")
REPORT_LIMIT = 16 << 20  # bytes of a report read back
LOAD_LIMITS = Limits(sandbox="none", timeout=300.0)  # the known-tests run: the task's own code, unsandboxed
CANARY_LIMITS = Limits(sandbox="none", timeout=60.0)  # the reference with a canary drawn for it, once at load
_known: dict[str, Any] = {}


@dataclass
class TestRun:
    done: Finished
    output: str  # the tail
    report: dict | None  # the verified payload
    status: str  # signed | missing | forged | unreadable


def _strs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _well_formed(report: Any) -> bool:
    """Every field of the report the type `verdict` reads it as: a signed report is the runner's
    only while the key stays secret, and the code under test shares the runner's process."""
    if not isinstance(report, dict):
        return False
    outcomes, params, hooks = report.get("outcomes"), report.get("params", {}), report.get("hooks")
    return (type(report.get("exitstatus")) is int and _strs(report.get("collected"))
            and isinstance(outcomes, dict) and all(
                isinstance(phases, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in phases.items())
                for phases in outcomes.values())
            and isinstance(params, dict) and all(isinstance(v, str) for v in params.values())
            and (hooks is None or _strs(hooks)) and _strs(report.get("tampered", [])))


def _read_report(io: Path, name: str, key: bytes) -> tuple[dict | None, str]:
    raw, status = read_back(io, name, REPORT_LIMIT)
    if raw is None:
        return None, status
    try:
        doc = hostile.loads(raw, REPORT_LIMIT)
        payload, mac = doc["payload"], doc["mac"]
        if not (isinstance(payload, str) and isinstance(mac, str)):
            return None, "unreadable"
        good = hmac.compare_digest(hmac.new(key, payload.encode(), hashlib.sha256).hexdigest().encode(),
                                   mac.encode("utf-8", "backslashreplace"))
    except (hostile.HostileData, KeyError, TypeError, UnicodeError):
        return None, "unreadable"
    if not good:
        return None, "forged"
    try:
        report = hostile.loads(payload, REPORT_LIMIT)
    except hostile.HostileData:
        return None, "unreadable"
    return (report, "signed") if _well_formed(report) else (None, "unreadable")


def run_tests(clean: Path, limits: Limits, hidden: tuple[Path, ...], collect_only: bool = False) -> TestRun:
    """The hidden tests of the clean room, by the runner, in a fresh sandbox. The runner's one-time
    file and its report are in a folder of the clean room with a random name (the sandbox's copy of
    it comes back when it ends), so the test run writes no host folder outside the disk cap."""
    io = clean / f".score-{secrets.token_hex(8)}"
    io.mkdir()
    try:
        for private in ("home", "tmp"):
            (io / private).mkdir()
        key, report = secrets.token_bytes(32), secrets.token_hex(16)
        ini = io / "pytest.ini"
        ini.write_text("[pytest]\n")
        fd = os.open(io / "nonce", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key.hex(), "report": report}, f)
        argv = [sys.executable, "-I", "-B", str(RUNNER), str(io), str(clean), "--", "-q", "-p", "no:cacheprovider",
                "-c", str(ini), "--rootdir", str(clean), "--confcutdir", str(clean),
                *(["--collect-only"] if collect_only else []), HIDDEN_DIR]
        done, output = run_sandboxed(argv, clean, clean_env(io / "home", io / "tmp"), limits, hidden)
        found, status = _read_report(io, report, key)
        return TestRun(done, output, found, status)
    finally:
        shutil.rmtree(io, ignore_errors=True)


def _passed(phases: Any) -> bool:
    return isinstance(phases, dict) and all(phases.get(p) == "passed" for p in ("setup", "call", "teardown"))


def fingerprint(report: dict, ids: tuple[str, ...], with_hooks: bool) -> tuple[str, str | None]:
    """Digests of the tests' parameters and of pytest's hook implementations in a run."""
    def digest(value: Any) -> str:
        return hashlib.sha256(json.dumps(value).encode()).hexdigest()

    params = report.get("params") if isinstance(report.get("params"), dict) else {}
    return digest([params.get(i) for i in ids]), digest(report.get("hooks")) if with_hooks else None


def verdict(task: CodingTask, run: TestRun, mode: str) -> TestOutcome:
    """The reward of a run against the task's known tests; metadata for the viewer."""
    known = task.known_tests or ()
    done, report = run.done, run.report
    meta: dict[str, Any] = {"mode": mode, "exit_code": done.code, "timed_out": done.timed_out,
                            "seconds": round(done.seconds, 3), "known": len(known), "report": run.status,
                            "output": run.output[-OUTPUT_KEPT:]}
    outcomes = report["outcomes"] if report is not None else {}
    passed = sum(_passed(outcomes.get(t)) for t in known)
    errors = sum(isinstance(outcomes.get(t), dict) and "failed" in (outcomes[t].get("setup"), outcomes[t].get(
        "teardown")) for t in known)
    meta.update(passed=passed, errors=errors, failed=len(known) - passed - errors)
    why = None
    if done.timed_out:
        why = "the tests timed out"
    elif report is None:
        why = f"no signed report from the test run ({run.status})"
    elif done.code not in (0, 1) or report["exitstatus"] != done.code:
        why = f"the test run did not end as pytest does (exit code {done.code}, pytest's {report['exitstatus']})"
    elif extra := sorted((set(report["collected"]) | set(outcomes)) - set(known) - set(task.canary_ids)):
        why = f"tests the task does not have ran: {', '.join(extra[:3])}"
    elif report.get("tampered"):
        why = str(report["tampered"][0])
    elif (canary := canaries.check(task.canary_ids, outcomes)) is not None:
        why = canary
    elif (mine := fingerprint(report, known, task.fingerprint[1] is not None)) != task.fingerprint:
        why = ("the tests ran with other parameters than the task's" if mine[0] != task.fingerprint[0] else
               "pytest's hooks differ from the task's own run (a plugin was added)")
    if why is not None:
        meta.update(passed=0, failed=len(known) - errors, zero=why)
        return TestOutcome(0.0, meta)
    if mode == "all-pass":  # with canaries (which fail by design) pytest's own exit is 1
        return TestOutcome(1.0 if passed == len(known) and (done.code == 0 or task.canary_ids) else 0.0, meta)
    return TestOutcome(passed / len(known), meta)


def clean_room(task: CodingTask, agent_ws: Path | None, overlay: Any = None,
               with_canaries: bool = True) -> tuple[Path, list[str]]:
    """A fresh copy of the pristine workspace with the agent's surface (or `overlay`, the reference)
    and the hidden tests (with the canaries, for harnessrl's runner); what was left out of the agent's surface."""
    clean = fresh_dir("clean-", ROOT)
    lay(task.workspace, clean)
    left_out = take_surface(agent_ws, task.solution, task.workspace, clean) if agent_ws is not None else []
    if overlay is not None:
        lay(overlay, clean)
    shutil.rmtree(clean / HIDDEN_DIR, ignore_errors=True)
    if task.hidden_tests is not None and calls.calls_text(task.hidden_tests) is None:  # data tests stay the host's
        lay(task.hidden_tests, clean)
        if with_canaries:  # not for a user's reward command: its score is read from its own output
            lay(dict(task.canaries), clean)
    return clean, left_out


def _zero(task: CodingTask, mode: str, why: str) -> TestOutcome:
    known = len(task.known_tests or ())
    return TestOutcome(0.0, {"mode": mode, "zero": why, "passed": 0, "errors": 0, "failed": known, "known": known,
                             "exit_code": -1, "timed_out": False, "seconds": 0.0, "output": ""})


def score_rollout(task: CodingTask, agent_ws: Path, reward_cmd: str | None, mode: str, limits: Limits,
                  hidden: tuple[Path, ...]) -> TestOutcome:
    """The reward of the agent's workspace: the known tests by the runner, or `reward_cmd`'s output.
    Total: whatever the agent left makes a score (an exception while handling its files, its report
    or its output is its 0, the reason in `zero`); only `ScorerFault` leaves, for the rollout's `failed`."""
    try:
        clean, left_out = clean_room(task, agent_ws, with_canaries=reward_cmd is None)
    except SurfaceError as exc:  # the policy made a surface too big to take: its failure
        return _zero(task, mode, str(exc))
    except Exception as exc:  # noqa: BLE001 - the agent's files, whatever they are, are its score
        return _zero(task, mode, hostile.safe_text(f"the agent's files could not be taken: {type(exc).__name__}: "
                                                   f"{exc}", 300))
    try:
        if reward_cmd is not None:
            outcome = score_in_place(clean, reward_cmd, mode, limits, hidden)
        else:
            assert task.known_tests, "the task's known tests are collected when it is loaded"
            cases = calls.read_cases(task.hidden_tests, "the task")
            run = run_tests(clean, limits, hidden) if cases is None else calls.run_calls(clean, cases, limits, hidden)
            try:
                outcome = verdict(task, run, mode) if cases is None else calls.calls_verdict(cases, run, mode)
            except Exception as exc:  # noqa: BLE001 - a report the checks missed is still the agent's
                outcome = _zero(task, mode, hostile.safe_text(f"the test run's report could not be read: "
                                                              f"{type(exc).__name__}: {exc}", 300))
    except ScorerFault:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. an output or a tree the host could not handle
        outcome = _zero(task, mode, hostile.safe_text(f"the agent's work could not be scored: {type(exc).__name__}: "
                                                      f"{exc}", 300))
    finally:
        shutil.rmtree(clean, ignore_errors=True)
    if left_out:
        outcome.metadata["left_out"] = [hostile.safe_text(line, 300) for line in left_out[:20]]
    outcome.metadata = hostile.safe_meta(outcome.metadata)
    return outcome


def score_in_place(ws: Path, reward_cmd: str, mode: str, limits: Limits, hidden: tuple[Path, ...]) -> TestOutcome:
    """A user's reward command over `ws` in a fresh sandbox, scored from its output."""
    io = fresh_dir("score-", ROOT)  # HOME and TMPDIR without a sandbox (bubblewrap makes its own)
    try:
        for private in ("home", "tmp"):
            (io / private).mkdir()
        done, output = run_sandboxed(reward_cmd, ws, host_env(io / "home", io / "tmp"), limits, hidden)
    finally:
        shutil.rmtree(io, ignore_errors=True)
    outcome = score(output, done, mode)
    outcome.metadata["command"] = reward_cmd
    return outcome


def host_env(home: Path, tmp: Path) -> dict[str, str]:
    """A user's reward command keeps the host's environment, less what leads to the proxy or into Python."""
    drop = ("HARNESSRL_", "OPENAI_", "ANTHROPIC_", "PYTHON", "PYTEST_ADDOPTS", "CODEX_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and "PROXY" not in k.upper()}
    return {**env, "HOME": str(home), "TMPDIR": str(tmp)}


def _tree_bytes(tree: Any) -> bytes:
    if isinstance(tree, Path):
        h = hashlib.sha256()
        for path in sorted(p for p in tree.rglob("*") if p.is_file()):
            h.update(str(path.relative_to(tree)).encode() + b"\0" + path.read_bytes() + b"\0")
        return h.digest()
    return json.dumps(tree, sort_keys=True).encode()


def reference_tree(reference: Any, where: str) -> dict[str, str] | None:
    """A reference given as inline files ({relative path: text}), checked; None for any other reference."""
    if not (isinstance(reference, dict) and reference and all(isinstance(v, str) for v in reference.values())):
        return None
    for name in reference:
        parts = PurePosixPath(name).parts
        if not parts or parts[0] == "/" or ".." in parts:
            raise UserError(f"{where}: reference file {name!r} is not a relative path inside the workspace")
    return reference


Known = tuple[tuple[str, ...], tuple[str, str | None]]


def known_tests(task: CodingTask, reference: dict[str, str] | None, where: str) -> Known:
    """The node ids of the task's hidden tests, all passing on its reference (collected only without
    one), and the fingerprint of that run (`fingerprint`). Data tests (calls.py): their case ids,
    checked on the reference."""
    cases = calls.read_cases(task.hidden_tests, where)
    if cases is not None:
        return calls.known_cases(task, cases, reference, where, clean_room, LOAD_LIMITS), ("calls", None)
    key = hashlib.sha256(b"\0".join([_tree_bytes(task.workspace), _tree_bytes(task.hidden_tests),
                                     _tree_bytes(reference), RUNNER.read_bytes(), sys.version.encode(),
                                     version("pytest").encode()])).hexdigest()
    if key in _known:
        return _known[key]
    cache_dir = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "harnessrl" / "known-tests"
    cache = cache_dir / f"{key}.json"
    try:
        doc = json.loads(cache.read_text())
        ids, prints = tuple(doc["tests"]), tuple(doc["fingerprint"])
        if ids and all(isinstance(i, str) for i in ids) and len(prints) == 2:
            _known[key] = ids, prints
            return _known[key]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    clean, _ = clean_room(task, None, reference)
    try:
        run = run_tests(clean, LOAD_LIMITS, (), collect_only=reference is None)
    finally:
        shutil.rmtree(clean, ignore_errors=True)
    last = (run.output.strip().splitlines() or [""])[-1][:200]
    if run.report is None or run.done.code not in (0, 1) or not run.report["collected"]:
        raise UserError(f"{where}: its hidden tests do not run on the {'reference' if reference else 'workspace'} "
                        f"(pytest exit code {run.done.code}: {last or run.status})")
    ids = tuple(run.report["collected"])
    failing = [t for t in ids if not _passed(run.report["outcomes"].get(t))] if reference is not None else []
    if failing or run.done.code != 0:
        raise UserError(f"{where}: {len(failing)} of its {len(ids)} hidden tests do not pass on its reference "
                        f"(first: {(failing or ['?'])[0]}; {last})")
    _known[key] = ids, fingerprint(run.report, ids, reference is not None)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"tests": list(ids), "fingerprint": list(_known[key][1])}))
    except OSError:
        pass  # a read-only cache only costs the next load a run
    return _known[key]


def with_canaries(task: CodingTask, reference: dict[str, str] | None) -> CodingTask:
    """`task` with a canary file drawn for it (canaries.py). With an inline reference, the draw is
    tried once on it: a canary that calls the task's function must fail there and leave its
    known tests passing, in bounded time; else the canary calls builtins only."""
    files, ids = canaries.make(task.hidden_tests)
    drawn = replace(task, canaries=tuple(files.items()), canary_ids=ids)
    if reference is None:
        return drawn
    clean, _ = clean_room(drawn, None, reference)
    try:
        run = run_tests(clean, CANARY_LIMITS, ())
    finally:
        shutil.rmtree(clean, ignore_errors=True)
    outcomes = run.report["outcomes"] if run.report is not None else {}
    if not run.done.timed_out and canaries.check(ids, outcomes) is None and all(
            _passed(outcomes.get(t)) for t in task.known_tests or ()):
        return drawn
    files, ids = canaries.make(task.hidden_tests, call_target=False)
    return replace(task, canaries=tuple(files.items()), canary_ids=ids)


def canaries_for_all(jobs: list[tuple[CodingTask, dict[str, str] | None]]) -> list[CodingTask]:
    """`with_canaries` of many tasks, a few at a time."""
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda job: with_canaries(*job), jobs))


def known_for_all(jobs: list[tuple[CodingTask, dict[str, str] | None, str]]) -> list[Known]:
    """`known_tests` of many tasks, a few at a time."""
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda job: known_tests(*job), jobs))
