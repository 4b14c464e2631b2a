"""A coding task's data and its pristine workspace; the reward of a user's own reward command.

A task's `workspace` and `hidden_tests` (tasks_file.py) are trees: a folder, or an inline
{relative path: text} object. Each rollout gets a fresh copy of the workspace under
`sandbox.run.ROOT` (created where the rollout runs: a Ray node needs no shared folder with inline
trees). After the harness has exited, hidden_tests.py scores it in a clean room. With the default
runner the reward comes from a signed per-test report (hidden_tests.py); a task's own `reward_cmd` (or
`--reward-cmd`) is scored here from its output: the pass fraction of its pytest summary line, or
all-pass (1 only if the command exits 0 and no test failed), or by its exit code when it prints
no pytest summary. The output's tail goes with the reward as its metadata, which the viewer shows.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.app.sandbox.run import ROOT, Finished
from harnessrl.errors import UserError

REWARD_MODES = ("pass-fraction", "all-pass")
OUTPUT_KEPT = 8000  # characters of the test output kept with the reward (the end: pytest's summary is there)
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|xfailed|xpassed|skipped)\b")
_SUMMARY = re.compile(r"^=*\s*(?:no tests ran|(?:\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|warnings?|"
                      r"deselected|rerun)(?:, )?)+)\b.* in [\d.]+s", re.MULTILINE)


@dataclass(frozen=True)
class CodingTask:
    """What a rollout needs of a coding task: plain data, so a runner holding it pickles (Ray)."""
    workspace: Any  # a folder (Path) or {relative path: text}
    hidden_tests: Any | None  # the same, laid over the workspace after the harness
    reward_cmd: str | None  # the task's own reward command
    source_paths: tuple[Path, ...] = ()  # host paths of the task data, hidden from the sandbox
    solution: tuple[str, ...] = ()  # the solution surface: workspace paths the agent's version of is scored
    known_tests: tuple[str, ...] | None = None  # the hidden tests' node ids (scoring.known_tests)
    fingerprint: tuple[str, str | None] = ("", None)  # digests of their parameters and of pytest's hooks
    canaries: tuple[tuple[str, str], ...] = ()  # pytest-mode canary files (path, text), drawn at load (canaries.py)
    canary_ids: tuple[str, ...] = ()  # their node ids: each must fail


@dataclass
class TestOutcome:
    reward: float
    metadata: dict[str, Any]


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
    if total == 0:  # the policy's code can stop collection: its 0, not a failed rollout
        return TestOutcome(0.0, meta)
    if mode == "all-pass":
        return TestOutcome(1.0 if done.code == 0 and counts["passed"] == total else 0.0, meta)
    return TestOutcome(counts["passed"] / total, meta)
