"""Toolbox tasks whose rollouts take long, with a long-tailed spread between tasks (the async
benchmark's family, `loop --harness toolbox_slow`, `bench/async_loop.py`).

Real CLI sessions spend most of their wall time in the environment, not in model calls: on this
machine, against a scripted model, a Claude Code rollout takes ~5 s, Codex ~10 s, mini-swe-agent
~17 s, and between tasks a session's length varies by about 10×. Here each task carries a
delay (`delay_s`) that its environment spends inside the rollout's first tool call (a test run,
a build), so the model calls stay as short as the toolbox's while the rollout's wall time is long.
A rollout that never calls a tool pays none, as a real session that answers without running
anything.

The delay is a lognormal draw per task id, `median_s · exp(SIGMA · z)` with z standard normal
from a generator seeded by the id alone: the same task is as slow in every run, seed and mode.
SIGMA = 0.7 puts the 95th percentile 10× above the 5th (exp(2 · 1.645 · 0.7) = 10.0), the
spread between tasks seen in real sessions, and the mean 1.28× the median (exp(SIGMA²/2)); of 32
tasks the slowest is about 4.3× the median (2.9–6.5× in 80 % of draws), which is what holds a
synchronous round.
A lognormal rather than a Pareto: its tail is long but all its moments exist, so a benchmark's
total rollout time does not hinge on one draw. MEDIAN_S is the default scale; the benchmark
chooses its own (`generate(..., median_s=)`), written into the tasks file.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from harnessrl.harness_examples.toolbox import tasks as toolbox

MEDIAN_S = 5.0  # Claude Code's ~5 s per rollout on this machine
SIGMA = 0.7  # p95/p5 = 10: the spread between tasks of real sessions


def delay_for(task_id: str, median_s: float = MEDIAN_S, sigma: float = SIGMA) -> float:
    """The task's environment delay in seconds: deterministic in the id, lognormal across ids."""
    z = random.Random(f"toolbox-slow-{task_id}").gauss(0.0, 1.0)
    return median_s * math.exp(sigma * z)


@dataclass(frozen=True)
class SlowTask(toolbox.ToolboxTask):
    delay_s: float = 0.0

    def row(self) -> dict:
        row = super().row()
        row["meta"] = {**row["meta"], "harness": "toolbox_slow", "delay_s": self.delay_s}
        return row


def slowed(tasks: list[toolbox.ToolboxTask], median_s: float = MEDIAN_S, sigma: float = SIGMA) -> list[SlowTask]:
    return [SlowTask(t.id, t.item, t.attribute, t.value, t.delegate, t.compact, delay_for(t.id, median_s, sigma))
            for t in tasks]


def generate(seed: int = 0, median_s: float = MEDIAN_S, sigma: float = SIGMA) -> tuple[list[SlowTask], list[SlowTask]]:
    """The toolbox's 64 training and 64 held-out tasks (compact prompt), each with its delay."""
    train, held = toolbox.generate(seed, compact=True)
    return slowed(train, median_s, sigma), slowed(held, median_s, sigma)


def write(tasks: list[SlowTask], path: str | Path) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(t.row()) + "\n" for t in tasks))
    return path


def read(path: str | Path) -> list[SlowTask]:
    delays = {json.loads(line)["id"]: json.loads(line)["meta"].get("delay_s", 0.0)
              for line in Path(path).read_text().splitlines() if line.strip()}
    return [SlowTask(t.id, t.item, t.attribute, t.value, t.delegate, t.compact, float(delays[t.id]))
            for t in toolbox.read(path)]


class SlowTable(Mapping):
    """A rollout's world whose first lookup takes `delay_s`. The toolbox's tools look their pair up
    (`pair in table`) before anything else reads the table, so the wait falls inside the first
    tool call, where an environment spends it; the scoring's later lookups are free."""

    def __init__(self, table: Mapping, delay_s: float):
        self._table, self._delay = table, delay_s
        self._lock = threading.Lock()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            delay, self._delay = self._delay, 0.0
        if delay:
            time.sleep(delay)
        return key in self._table

    def __getitem__(self, key):
        return self._table[key]

    def __iter__(self) -> Iterator:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)


def run_rollout(url: str, table: Mapping, task: SlowTask, temperature: float, *, group_id: str, run: str):
    """The toolbox's rollout, its environment taking the task's delay in the first tool call."""
    from harnessrl.harness_examples.toolbox import harness

    return harness.run_rollout(url, SlowTable(table, task.delay_s), task,
                               harness.ToolboxConfig(temperature=temperature), group_id=group_id, run=run)
