"""python -m harnessrl.harness_examples.bfcl_multiturn --proxy URL [options]"""

from __future__ import annotations

from pathlib import Path

import typer

from harnessrl.cli_options import renamed
from harnessrl.console import Console
from harnessrl.errors import UserError
from harnessrl.harness_examples import search_cli as o
from harnessrl.harness_examples.bfcl_multiturn.data import export_tasks as write_tasks
from harnessrl.harness_examples.bfcl_multiturn.data import load_tasks
from harnessrl.harness_examples.bfcl_multiturn.harness import BfclConfig, run_rollout
from harnessrl.harness_examples.runner import main, results_table, run_many

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def bfcl_multiturn(
    proxy: str = o.PROXY,
    category: str = typer.Option("multi_turn_base", help="BFCL multi-turn category."),
    ids: list[str] = typer.Option(None, "--id", help="Task id (repeatable); default: the first --n-tasks."),
    group_old: int = o.GROUP_OLD,
    n_tasks: int = o.N_TASKS, group: int = o.GROUP, concurrency: int = o.CONCURRENCY, model: str = o.MODEL,
    max_tokens: int = o.MAX_TOKENS, temperature: float = o.TEMPERATURE, run: str = o.RUN,
    export_tasks: Path = o.EXPORT,
    max_steps_per_turn: int = typer.Option(5, help="Model calls per user turn."),
) -> None:
    """BFCL multi-turn tasks with the executable back-ends; outcome = BFCL's state check."""
    group = renamed(group, group_old, "--group", "--group-size")
    if n_tasks < 1:
        raise UserError("--n-tasks must be at least 1")
    tasks = load_tasks(category, ids=ids or None, limit=None if ids else n_tasks)
    if export_tasks is not None:
        Console().print(f"wrote {write_tasks(tasks, export_tasks)} tasks to {export_tasks}")
        return
    if not proxy:
        raise UserError("--proxy URL is required (or --export-tasks FILE)")
    cfg = BfclConfig(model=o.model_name(proxy, model), max_steps_per_turn=max_steps_per_turn, max_tokens=max_tokens,
                     temperature=temperature)
    results = run_many(lambda task: run_rollout(proxy, task, cfg, run=run), tasks, group, concurrency)
    Console().print(results_table(results, "bfcl_multiturn"))


if __name__ == "__main__":
    main(app)
