"""One command run in a rollout (`harnessrl run`, `loop --cmd`): what it is given (`RunOptions`),
what comes back (`RunResult`) and the outcome read from the program itself (`--reward-from`).
Its own module because both ways of running the command read it: run_cmd.py (as it is) and
limited_run.py (under limits, which run_cmd.py hands a limited command to).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.app.sandbox.run import Limits
from harnessrl.app.scoring import hostile
from harnessrl.app.scoring.workspace import CodingTask
from harnessrl.errors import UserError

REWARD_SOURCES = ("exit-code", "stdout-json")  # or a file path


@dataclass
class RunOptions:
    task: str | None = None
    group: str | None = None
    run: str | None = None
    agent: str = "main"
    reward_from: str | None = None  # exit-code | stdout-json | a file the command writes its outcome to
    metadata: dict | None = None
    limits: Limits | None = None  # timeout, memory, CPU, sandbox (sandbox/run.py, limited_run.py); None: the command runs as it is
    coding: CodingTask | None = None  # a workspace to copy fresh and hidden tests to score it
    workspace: Path | None = None  # without `coding`: the folder a limited command runs (and may write) in
    reward_cmd: str | None = None  # scores the workspace after the command (default: the task's, or pytest)
    reward_mode: str = "pass-fraction"
    readable: tuple[Path, ...] = ()  # host folders a sandboxed command reads (e.g. its {task} file's)
    hidden: tuple[Path, ...] = ()  # host paths a sandboxed command must not read (the loop's --out, the records DB)


@dataclass
class RunResult:
    rollout_id: str
    exit_code: int
    outcome: float | None
    warnings: list[str] = field(default_factory=list)
    error: str | None = None  # what went wrong (crash, timeout, refused calls); with no outcome, finished as failed
    metrics: dict[str, float] = field(default_factory=dict)


def _reward_from_text(text: str) -> float | None:
    """`0.7`, or a JSON object with a numeric "reward"; None for anything else, however it is made
    (the program's output is its own: a line nested past Python's parser is no reward, not a crash)."""
    try:
        value = hostile.loads(text, 1 << 20)
    except hostile.HostileData:
        return None
    if isinstance(value, dict):
        value = value.get("reward")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def check_reward_from(source: str | None) -> None:
    if source is not None and not source.strip():
        raise UserError(f"--reward-from: use {' | '.join(REWARD_SOURCES)} | FILE")


def outcome_of(source: str | None, code: int, last_line: str | None, reward_file: Path | None) -> tuple[float | None, str | None]:
    """(outcome, warning) of a finished command."""
    if source is None:
        return None, None
    if source == "exit-code":
        return (1.0 if code == 0 else 0.0), None
    if source == "stdout-json":
        value = _reward_from_text(last_line or "")
        return value, None if value is not None else 'the last line of stdout holds no reward (want 0.7 or {"reward": 0.7})'
    assert reward_file is not None
    value = _reward_from_text(_read_reward_file(reward_file))
    return value, None if value is not None else f"{reward_file} holds no reward (want 0.7 or {{\"reward\": 0.7}})"


def _read_reward_file(path: Path) -> str:
    """The reward file's text, never through a link the command made (it could point the host at
    another rollout's file) and never more than a reward's worth of bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # missing, or a link
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return ""
        return f.read(4096).decode(errors="replace").strip()


def reward_file_of(opts: RunOptions, env: dict[str, str]) -> Path | None:
    """`--reward-from FILE`: the file (a stale one removed), its path in $HARNESSRL_REWARD_FILE."""
    if opts.reward_from in (None, *REWARD_SOURCES):
        return None
    reward_file = Path(opts.reward_from).resolve()
    reward_file.unlink(missing_ok=True)  # a stale outcome must not be taken for this run's
    env["HARNESSRL_REWARD_FILE"] = str(reward_file)
    return reward_file
