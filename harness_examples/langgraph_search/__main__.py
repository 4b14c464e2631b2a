"""python -m harnessrl.harness_examples.langgraph_search --proxy URL [options]"""

from __future__ import annotations

from pathlib import Path

import typer

from harnessrl.cli_options import renamed
from harnessrl.console import Console
from harnessrl.harness_examples import search_cli as o
from harnessrl.harness_examples.langgraph_search.harness import LangGraphConfig, run_rollout
from harnessrl.harness_examples.runner import main, results_table, run_many

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def langgraph_search(
    proxy: str = o.PROXY, corpus: Path = o.CORPUS, qa: Path = o.QA_FILE, seed: int = o.SEED, n_tasks: int = o.N_TASKS,
    group_old: int = o.GROUP_OLD,
    group: int = o.GROUP, concurrency: int = o.CONCURRENCY, model: str = o.MODEL, max_tokens: int = o.MAX_TOKENS,
    temperature: float = o.TEMPERATURE, reward: str = o.REWARD, run: str = o.RUN, export_tasks: Path = o.EXPORT,
    max_turns: int = typer.Option(6, help="Agent steps before the episode ends without an answer."),
) -> None:
    """The search task as a LangGraph agent (ChatOpenAI pointed at the proxy)."""
    group = renamed(group, group_old, "--group", "--group-size")
    tasks = o.prepare(proxy, corpus, qa, seed, n_tasks, reward, export_tasks)
    if tasks is None:
        return
    cfg = LangGraphConfig(model=o.model_name(proxy, model), max_turns=max_turns, max_tokens=max_tokens,
                          temperature=temperature, reward=reward)
    results = run_many(lambda task: run_rollout(proxy, tasks.env, task, cfg, run=run), tasks.tasks, group, concurrency)
    Console().print(results_table(results, "langgraph_search"))


if __name__ == "__main__":
    main(app)
