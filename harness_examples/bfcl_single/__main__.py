"""python -m harnessrl.harness_examples.bfcl_single --proxy URL [options]"""

from __future__ import annotations

from pathlib import Path

import typer

from harnessrl.console import Console
from harnessrl.errors import UserError
from harnessrl.harness_examples import search_cli as o
from harnessrl.harness_examples.bfcl_single.data import CATEGORIES, choose, load_tasks, write
from harnessrl.harness_examples.bfcl_single.harness import BfclSingleConfig, run_rollout
from harnessrl.harness_examples.runner import main, results_table, run_many

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def bfcl_single(
    proxy: str = o.PROXY,
    categories: str = typer.Option(",".join(CATEGORIES), help="Comma-separated BFCL single-turn categories."),
    held: bool = typer.Option(False, "--held-out", help="Held-out ids (those the loop evaluates on) instead of a "
                              "seeded draw of training ids."),
    ids: list[str] = typer.Option(None, "--id", help="Task id (repeatable); default: --n-tasks of the categories."),
    n_tasks: int = o.N_TASKS, seed: int = typer.Option(0, "--seed", help="Seed of the training draw."),
    group: int = o.GROUP, concurrency: int = o.CONCURRENCY, model: str = o.MODEL,
    max_tokens: int = o.MAX_TOKENS, temperature: float = o.TEMPERATURE, run: str = o.RUN,
    export_tasks: Path = o.EXPORT,
) -> None:
    """BFCL single-turn entries; outcome = BFCL's AST checker on the model's tool calls."""
    if n_tasks < 1:
        raise UserError("--n-tasks must be at least 1")
    cats = [c.strip() for c in categories.split(",") if c.strip()]
    if ids:
        by_id = {t.id: t for t in load_tasks(cats)}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise UserError(f"no BFCL task {missing[0]!r} in {', '.join(cats)}")
        tasks = [by_id[i] for i in ids]
    else:  # the loop's choice, categories in turn: n held-out ids and one training, or the reverse
        train, held_ids = choose(load_tasks(cats), n_tasks + 1, (n_tasks if held else 1) / (n_tasks + 1), seed)
        tasks = held_ids if held else train
    if export_tasks is not None:
        Console().print(f"wrote {len(tasks)} tasks to {write(tasks, export_tasks)}")
        return
    if not proxy:
        raise UserError("--proxy URL is required (or --export-tasks FILE)")
    cfg = BfclSingleConfig(model=o.model_name(proxy, model), max_tokens=max_tokens, temperature=temperature)
    results = run_many(lambda task: run_rollout(proxy, task, cfg, run=run), tasks, group, concurrency)
    Console().print(results_table(results, "bfcl_single"))


if __name__ == "__main__":
    main(app)
