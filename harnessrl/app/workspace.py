"""A coding task's rollout: a fresh workspace, and the reward from its hidden tests.

A task's `workspace` and `hidden_tests` (tasks_file.py) are trees: a folder, or an inline
{relative path: text} object. Each rollout gets a fresh copy of the workspace under
`sandbox.ROOT` (created where the rollout runs: a Ray node needs no shared folder with inline
trees). After the harness has exited, the hidden tests are laid over the workspace (a
`hidden_tests/` the agent made is removed first, so nothing it planted survives) and the reward
command runs in the same sandbox with the same limits. Its reward is the pass fraction of the
pytest summary line, or all-pass (1 only if the command exits 0 and no test failed); a command
whose output has no pytest summary is scored by its exit code in both modes. The output's tail
goes with the reward as its metadata, which the viewer shows.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.app.sandbox import ROOT, Finished, HostRelay, Limits, Mounts, run_limited
from harnessrl.errors import UserError

REWARD_MODES = ("pass-fraction", "all-pass")
HIDDEN_DIR = "hidden_tests"
OUTPUT_KEPT = 8000  # characters of the test output kept with the reward (the end: pytest's summary is there)
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|xfailed|xpassed|skipped)\b")
_SUMMARY = re.compile(r"^=*\s*(?:no tests ran|(?:\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|warnings?|"
                      r"deselected|rerun)(?:, )?)+)\b.* in [\d.]+s", re.MULTILINE)


def default_reward_cmd() -> str:
    """pytest on the hidden tests, with the Python running harnessrl (where pytest is installed)."""
    return f"{shlex.quote(sys.executable)} -m pytest -q -p no:cacheprovider {HIDDEN_DIR}"


@dataclass(frozen=True)
class CodingTask:
    """What a rollout needs of a coding task: plain data, so a runner holding it pickles (Ray)."""
    workspace: Any  # a folder (Path) or {relative path: text}
    hidden_tests: Any | None  # the same, laid over the workspace after the harness
    reward_cmd: str | None  # the task's own reward command
    source_paths: tuple[Path, ...] = ()  # host paths of the task data, hidden from the sandbox


@dataclass
class TestOutcome:
    reward: float | None  # None: the tests could not be scored (no tests collected)
    metadata: dict[str, Any]
    error: str | None = None


def check_tree(tree: Any, where: str) -> None:
    """A folder tree must exist before any rollout starts (an inline one was checked when read)."""
    if isinstance(tree, Path) and not tree.is_dir():
        raise UserError(f"{where}: folder not found: {tree}")


def lay(tree: Any, dest: Path) -> None:
    """Write a tree into `dest` (files it names are replaced)."""
    if isinstance(tree, Path):
        shutil.copytree(tree, dest, dirs_exist_ok=True, symlinks=True)
        return
    for name, text in tree.items():
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def fresh_workspace(task: CodingTask) -> Path:
    ROOT.mkdir(parents=True, exist_ok=True)
    ws = Path(tempfile.mkdtemp(prefix="ws-", dir=ROOT))
    lay(task.workspace, ws)
    return ws


def pytest_counts(output: str) -> dict[str, int] | None:
    """passed / failed / errors of pytest's last summary line; None when there is none."""
    lines = _SUMMARY.findall(output)
    if not lines:
        return None
    counts = {"passed": 0, "failed": 0, "errors": 0}
    for n, kind in _COUNT.findall(lines[-1]):
        key = {"error": "errors", "xpassed": "passed"}.get(kind, kind)
        if key in counts:
            counts[key] += int(n)
    return counts


def score(output: str, done: Finished, mode: str) -> TestOutcome:
    counts = pytest_counts(output)
    meta: dict[str, Any] = {"mode": mode, "exit_code": done.code, "timed_out": done.timed_out,
                            "seconds": round(done.seconds, 3), "output": output[-OUTPUT_KEPT:]}
    if done.timed_out:
        # the code the policy wrote hangs its tests: the policy's failure, scored 0
        meta.update(counts or {})
        return TestOutcome(0.0, meta)
    if counts is None:
        return TestOutcome(1.0 if done.code == 0 else 0.0, meta)
    meta.update(counts)
    total = counts["passed"] + counts["failed"] + counts["errors"]
    if total == 0:
        return TestOutcome(None, meta, "the reward command collected no tests (is the task's hidden_tests right?)")
    if mode == "all-pass":
        return TestOutcome(1.0 if done.code == 0 and counts["passed"] == total else 0.0, meta)
    return TestOutcome(counts["passed"] / total, meta)


def run_hidden_tests(hidden_tests: Any | None, ws: Path, cmd: str, mode: str, env: dict[str, str],
                     limits: Limits, mounts: Mounts, host_relay: HostRelay | None) -> TestOutcome:
    """Lay the hidden tests (if any) over the workspace and run the reward command in it."""
    if hidden_tests is not None:
        shutil.rmtree(ws / HIDDEN_DIR, ignore_errors=True)
        lay(hidden_tests, ws)
    log = ws.parent / f"{ws.name}.reward.log"
    try:
        with open(log, "w+") as out:
            done = run_limited(cmd, env, limits, mounts, host_relay, out)
            out.seek(0)
            output = out.read()
    finally:
        log.unlink(missing_ok=True)
    outcome = score(output, done, mode)
    outcome.metadata["command"] = cmd
    return outcome
