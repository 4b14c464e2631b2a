"""`<out>/loop_state.json`: what a loop has done, written after every step of it so that a loop
killed at any point resumes where it was (atomically: a crash leaves the old state or the new).

Both drivers keep the start (the teacher warm-up, the held-out success at the start) and the
checkpoint the next step starts from (`model`). The round driver adds a row per round; the
asynchronous driver a row per optimizer step, each rollout group with its status, the weight
versions it has pushed (`versions`, oldest first: index 0 is the weights it started from), its
held-out evaluations and its totals.

A row's `train_log` holds the trainer's logged metrics, among them the training–inference mismatch
(`mismatch/kl`, `mismatch/out_of_band_frac`: docs/methods.md §6.5) that the tables and the viewer show."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.errors import UserError


@dataclass
class RoundRow:
    round: int
    train_reward: float
    train_success: float
    tool_validity: float
    eval_success: float
    tokens: int
    samples: int
    seconds: float
    version: str
    checkpoint: str
    eval_validity: float = 0.0  # tool-call validity on the held-out tasks
    eval_metrics: dict[str, float] = field(default_factory=dict)  # means of the harness's metrics, held out
    failed: int = 0  # training rollouts that failed (crash, timeout, lost node): in no mean, never a 0 reward
    group_success: float = 0.0  # training groups (tasks) with at least one success: those an outcome reward can rank
    train_log: dict[str, float] = field(default_factory=dict)  # the trainer's logged metrics, means over the round's steps
    train_s: float = 0.0  # the trainer's busy time: training and the push
    rollout_s: float = 0.0  # the training rollouts' wall times, summed (÷ --concurrency: the rollouts' share of a no-idle run)


@dataclass
class LoopState:
    model: str  # the checkpoint the next round (or step) starts from
    mode: str = "sync"  # sync (rounds) | async (steps): a loop resumes in the mode it started in
    attempts: int = 0
    initial_eval: float | None = None
    teacher: dict[str, Any] | None = None  # the finished warm-up round: run tag, traces, checkpoint
    initial_validity: float | None = None  # held-out tool-call validity at the start
    initial_metrics: dict[str, float] | None = None  # held-out means of the harness's metrics at the start
    rounds: list[dict[str, Any]] = field(default_factory=list)
    # --async: the versions pushed (index 0: the start), the groups by id, a row per optimizer step,
    # the held-out evaluations and the totals (async_driver.py)
    versions: list[str | None] = field(default_factory=lambda: [None])
    next_group: int = 0
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.lock = threading.RLock()  # the async driver's threads change it and save it under this

    @classmethod
    def load(cls, path: Path, model: str, mode: str) -> LoopState:
        if not path.exists():
            return cls(model=model, mode=mode)
        state = cls(**json.loads(path.read_text()))
        if state.mode != mode:
            raise UserError(f"{path} is a {state.mode} loop's: resume it {'with' if state.mode == 'async' else 'without'} "
                            "--async, or give another --out")
        return state

    def save(self, path: Path) -> None:
        with self.lock:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(self), indent=2))
            tmp.replace(path)  # atomic: a crash leaves the old state or the new one
