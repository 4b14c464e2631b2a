"""Running an example harness from the command line: K rollouts per task, a few at a time,
with a progress bar and a results table; user errors become one line and exit code 2."""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import typer
from rich.progress import Progress
from rich.table import Table

from harnessrl.console import Console
from harnessrl.errors import UserError
from harnessrl.harness_examples.chat import RolloutResult


def run_many(run_one: Callable[[Any], RolloutResult], tasks: Sequence[Any], group: int, concurrency: int,
             label: str = "rollouts", deadline: float | None = None,
             late: Callable[[Any], RolloutResult] | None = None) -> list[RolloutResult]:
    """`group` rollouts of every task, `concurrency` at a time; results in task order.

    Each rollout runs on a thread of its own, waiting on the proxy or on the command it started,
    so the GIL is not what limits them. `deadline`: seconds one rollout may take; one still running
    then is given up and `late(task)` stands for its result. Its thread cannot be stopped: it is a
    daemon, so that it cannot hold the process at exit, and its result, should it come, is dropped."""
    if group < 1 or concurrency < 1:
        raise UserError("--group and --concurrency must be at least 1")
    if deadline is not None and late is None:
        raise ValueError("run_many: a deadline needs `late`, the result that stands for a rollout given up")
    jobs = [task for task in tasks for _ in range(group)]
    results: list[RolloutResult | None] = [None] * len(jobs)
    done: queue.Queue[tuple[int, RolloutResult | None, BaseException | None]] = queue.Queue()
    running: dict[int, float] = {}  # job index -> when it started

    def work(i: int) -> None:
        try:
            done.put((i, run_one(jobs[i]), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
            done.put((i, None, exc))

    waiting = iter(range(len(jobs)))
    with Progress(transient=True) as progress:
        bar = progress.add_task(label, total=len(jobs))
        while True:
            while len(running) < concurrency and (i := next(waiting, None)) is not None:
                running[i] = time.monotonic()
                threading.Thread(target=work, args=(i,), name=f"rollout-{i}", daemon=True).start()
            if not running:
                break
            wait = None if deadline is None else max(0.0, min(running.values()) + deadline - time.monotonic())
            try:
                i, result, exc = done.get(timeout=wait)
            except queue.Empty:  # the oldest rollout's deadline passed
                now = time.monotonic()
                for i in [i for i, t0 in running.items() if now - t0 >= deadline]:  # type: ignore[operator]
                    del running[i]
                    results[i] = late(jobs[i])  # type: ignore[misc]
                    progress.advance(bar)
                continue
            if i not in running:  # a given-up rollout finished after all: it was counted as failed
                continue
            del running[i]
            if exc is not None:
                raise exc
            results[i] = result
            progress.advance(bar)
    return results  # type: ignore[return-value]


def results_table(results: list[RolloutResult], title: str) -> Table:
    table = Table(title=title)
    for col in ("task", "rollout", "outcome", "success", "model calls", "tool calls", "tool errors", "answer / stop"):
        table.add_column(col)
    for r in results:
        m = r.metrics
        table.add_row(r.task_id, r.rollout_id, f"{r.outcome:.2f}", f"{m.get('success', 0):.0f}",
                      str(m.get("model_calls", "")), str(m.get("tool_calls", "")), str(m.get("tool_errors", "")),
                      (r.error or r.answer)[:40])
    if results:
        mean = sum(r.outcome for r in results) / len(results)
        success = sum(r.metrics.get("success", 0) for r in results) / len(results)
        table.caption = f"mean outcome {mean:.3f}, success rate {success:.3f} over {len(results)} rollouts"
    return table


def main(app: typer.Typer) -> None:
    """Run a typer app; user errors and unreachable servers are one line on stderr, exit 2."""
    import httpx
    import openai

    try:
        app()
    except UserError as exc:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {exc}", highlight=False)
        sys.exit(2)
    except (openai.APIConnectionError, httpx.ConnectError, httpx.ConnectTimeout) as exc:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] cannot reach the proxy ({exc})", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
