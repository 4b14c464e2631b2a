"""python -m harnessrl.harness_examples.lookup --proxy URL [--tasks FILE | --n-tasks N]"""

from __future__ import annotations

from pathlib import Path

import typer

from harnessrl.console import Console
from harnessrl.harness_examples.lookup import tasks as lookup_tasks
from harnessrl.harness_examples.lookup.harness import LookupConfig, run_rollout
from harnessrl.harness_examples.runner import main, results_table, run_many

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def lookup(
    proxy: str = typer.Option(..., help="harnessrl proxy URL, e.g. http://127.0.0.1:8000"),
    tasks: Path | None = typer.Option(None, help="Lookup task JSONL (default: generate --n-tasks)."),
    n_tasks: int = typer.Option(4, help="Tasks to generate when --tasks is not given."),
    seed: int = typer.Option(0, help="Seed of the generated tasks."),
    group: int = typer.Option(2, help="Rollouts per task."),
    concurrency: int = typer.Option(4, help="Rollouts in flight at once."),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    export_tasks: Path | None = typer.Option(None, help="Write the tasks as JSONL (for `harnessrl tasks import`) and exit."),
) -> None:
    """Look a key up with the `lookup` tool, answer with its value."""
    task_list = lookup_tasks.read(tasks) if tasks else lookup_tasks.generate(n_tasks, seed)
    if export_tasks:
        lookup_tasks.write(task_list, export_tasks)
        Console().print(f"wrote {len(task_list)} tasks to {export_tasks}")
        return
    table = {t.key: t.value for t in task_list}
    cfg = LookupConfig(temperature=temperature)
    results = run_many(lambda t: run_rollout(proxy, table, t, cfg), task_list, group, concurrency)
    Console().print(results_table(results, "lookup"))


if __name__ == "__main__":
    main(app)
