"""python -m harnessrl.harness_examples.planner_worker --proxy URL [options]"""

from __future__ import annotations

from pathlib import Path

import typer

from harnessrl.cli_options import renamed
from harnessrl.console import Console
from harnessrl.harness_examples import search_cli as o
from harnessrl.harness_examples.planner_worker.harness import PlannerWorkerConfig, run_rollout
from harnessrl.harness_examples.runner import main, results_table, run_many

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def planner_worker(
    proxy: str = o.PROXY, corpus: Path = o.CORPUS, qa: Path = o.QA_FILE, seed: int = o.SEED, n_tasks: int = o.N_TASKS,
    group_old: int = o.GROUP_OLD,
    group: int = o.GROUP, concurrency: int = o.CONCURRENCY, model: str = o.MODEL, max_tokens: int = o.MAX_TOKENS,
    temperature: float = o.TEMPERATURE, reward: str = o.REWARD, run: str = o.RUN, export_tasks: Path = o.EXPORT,
    max_planner_turns: int = typer.Option(4, help="Planner replies before the episode ends without an answer."),
    max_worker_turns: int = typer.Option(3, help="Search turns per worker before its summary turn."),
    always_dispatch_first: bool = typer.Option(
        False, help="If the planner's first reply dispatches no search agent, dispatch one with the user's question."),
) -> None:
    """Planner–worker multi-hop search: the planner dispatches search agents, then answers."""
    group = renamed(group, group_old, "--group", "--group-size")
    tasks = o.prepare(proxy, corpus, qa, seed, n_tasks, reward, export_tasks)
    if tasks is None:
        return
    cfg = PlannerWorkerConfig(model=o.model_name(proxy, model), max_planner_turns=max_planner_turns,
                              max_worker_turns=max_worker_turns, max_tokens=max_tokens, temperature=temperature,
                              reward=reward, always_dispatch_first=always_dispatch_first)
    results = run_many(lambda task: run_rollout(proxy, tasks.env, task, cfg, run=run), tasks.tasks, group, concurrency)
    Console().print(results_table(results, "planner_worker"))


if __name__ == "__main__":
    main(app)
