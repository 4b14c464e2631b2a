"""What bench/async_loop.py measures of one finished loop run, from its out dir alone: its
`loop_state.json` and its records DB (`runs.db`).

- wall: from the first training rollout's start to the last rollout's end (the final held-out
  evaluation included), from the records; the process's start-up and the held-out evaluation at
  the start, the same in both modes, are left out (the loop's own `wall_s` differs between the
  drivers: the round driver's sums its rounds, the async driver's counts from its start);
- trainer idle: 1 − trainer busy time ÷ wall, the busy time being the loop's own account
  (`totals.train_s`: train and push of every step or round);
- inference idle: the fraction of the wall window in which no model call was in flight, from the
  recorded calls (each from its `created_at` for `latency_ms`; their union, clipped to the
  window): the cheapest honest measure there is without instrumenting the backend — a call queued
  behind another counts as in flight, so it can only make the server look busier than it is;
- rollout time: the sum of the durations of the training rollouts that finished (every run tag
  but `eval…`), each from its record's creation to its finish;
- the no-idle bound: max(rollout time ÷ concurrency, trainer busy time), the wall time below which
  neither the rollout slots nor the trainer could have been kept busy;
- staleness (async), held-out success at the last step, the trainer's loss per step or round, and
  the mean of its mismatch KL (docs/methods.md §6.5) over them.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path


def union_seconds(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """The length of the union of the intervals, each clipped to [lo, hi]."""
    total, end = 0.0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= a:
            continue
        if a > end:
            total += b - a
        elif b > end:
            total += b - end
        end = max(end, b)
    return total


def call_intervals(db: Path) -> list[tuple[float, float]]:
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT created_at, latency_ms FROM calls WHERE latency_ms IS NOT NULL").fetchall()
    return [(c, c + ms / 1e3) for c, ms in rows]


def rollout_seconds(db: Path) -> tuple[float, int, tuple[float, float]]:
    """Summed duration and count of the training rollouts that finished (held-out evaluations left
    out, and the async loop's groups still out at its end, failed then), and the wall window: the
    first training rollout's start to the last rollout's end."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT created_at, finished_at FROM rollouts WHERE status = 'finished' "
                           "AND (run IS NULL OR run NOT LIKE 'eval%')").fetchall()
        (end,) = con.execute("SELECT max(finished_at) FROM rollouts").fetchone()
    return sum(f - c for c, f in rows), len(rows), (min(c for c, _ in rows), end)


def measure(out: Path, concurrency: int, n_eval: int) -> dict:
    """The run's figures (module docstring)."""
    state = json.loads((out / "loop_state.json").read_text())
    rollout_s, n_rollouts, (t0, t1) = rollout_seconds(out / "runs.db")
    wall = t1 - t0
    busy_calls = union_seconds(call_intervals(out / "runs.db"), t0, t1)
    totals = state["totals"]
    train_s = float(totals["train_s"])
    mode = state.get("mode", "sync")
    if mode == "async":
        evals = state["evals"]
        held, curve = evals[-1]["success"], [e["success"] for e in evals]
        logs = [s["train_log"] for s in state["steps"]]
        samples = sum(s["samples"] for s in state["steps"])
        stale = (totals["mean_staleness"], totals["max_staleness"], totals["dropped_stale"])
    else:
        rows = state["rounds"]
        held, curve = rows[-1]["eval_success"], [r["eval_success"] for r in rows]
        logs = [r["train_log"] for r in rows]
        samples = sum(r["samples"] for r in rows)
        stale = (0.0, 0, 0)
    losses = [log["loss"] for log in logs if log.get("loss") is not None]
    kl = [log["mismatch/kl"] for log in logs if log.get("mismatch/kl") is not None]
    return {"mode": mode, "wall_s": wall, "train_s": train_s, "rollout_s": rollout_s, "rollouts": n_rollouts,
            "trainer_idle": 1 - train_s / wall, "inference_idle": 1 - busy_calls / wall,
            "bound_s": max(rollout_s / concurrency, train_s), "mean_staleness": stale[0], "max_staleness": stale[1],
            "dropped_stale": stale[2], "held_out": held, "curve": curve, "initial": state.get("initial_eval"),
            "n_eval": n_eval, "steps": totals["steps"], "samples": samples, "losses": losses,
            "mismatch_kl": sum(kl) / len(kl) if kl else None, "totals": totals}
