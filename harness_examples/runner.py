"""Running an example harness from the command line: K rollouts per task, a few at a time,
with a progress bar and a results table; user errors become one line and exit code 2."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from harnessrl.errors import UserError
from harnessrl.harness_examples.chat import RolloutResult


def run_many(run_one: Callable[[Any], RolloutResult], tasks: Sequence[Any], group: int, concurrency: int,
             label: str = "rollouts") -> list[RolloutResult]:
    """`group` rollouts of every task, `concurrency` at a time; results in task order."""
    if group < 1 or concurrency < 1:
        raise UserError("--group and --concurrency must be at least 1")
    jobs = [task for task in tasks for _ in range(group)]
    results: list[RolloutResult | None] = [None] * len(jobs)
    with Progress(transient=True) as progress, ThreadPoolExecutor(concurrency) as pool:
        bar = progress.add_task(label, total=len(jobs))
        futures = {pool.submit(run_one, task): i for i, task in enumerate(jobs)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
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
