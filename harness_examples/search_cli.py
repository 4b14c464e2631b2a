"""Options shared by the command lines of the search examples (planner_worker, react, langgraph_search)."""

from __future__ import annotations

from pathlib import Path

import typer

from harnessrl.cli_options import old_spelling
from harnessrl.client import default_key
from harnessrl.console import Console
from harnessrl.errors import UserError
from harnessrl.harness_examples.chat import make_client, resolve_model
from harnessrl.harness_examples.search_task import SearchTaskSet, export_tasks, load_search_tasks

PROXY = typer.Option(None, "--proxy", help="harnessrl proxy URL, e.g. http://127.0.0.1:8000.")
CORPUS = typer.Option(None, "--corpus", help="Corpus JSONL (text, optional id/title); default: a generated fictional world.")
QA_FILE = typer.Option(None, "--qa", help="QA JSONL (question, answer); give it with --corpus.")
SEED = typer.Option(0, "--seed", help="Seed of the generated world.")
N_TASKS = typer.Option(4, "--n-tasks", help="Use the first N questions.")
GROUP = typer.Option(1, "--group-size", help="Rollouts per task (as in `harnessrl loop`).")
GROUP_OLD = old_spelling("--group")  # until the next release: the name before --group-size
CONCURRENCY = typer.Option(2, "--concurrency", help="Rollouts running at once.")
MODEL = typer.Option(None, "--model", help="Model name to send; default: the first the proxy lists.")
MAX_TOKENS = typer.Option(256, "--max-tokens", help="Completion token limit per model call.")
TEMPERATURE = typer.Option(1.0, "--temperature")
REWARD = typer.Option("f1", "--reward", help="Outcome reported to the proxy: f1 or em.")
RUN = typer.Option(None, "--run", help="Run label stored on the rollouts (e.g. a round).")
EXPORT = typer.Option(None, "--export-tasks", help="Write the tasks as `harnessrl tasks import` JSONL and exit.")


def prepare(proxy: str | None, corpus: Path | None, qa: Path | None, seed: int, n_tasks: int, reward: str,
            export: Path | None) -> SearchTaskSet | None:
    """Load the tasks; with --export-tasks write them and return None (nothing to run)."""
    if reward not in ("f1", "em"):
        raise UserError("--reward must be f1 or em")
    if n_tasks < 1:
        raise UserError("--n-tasks must be at least 1")
    tasks = load_search_tasks(corpus, qa, seed=seed, n_tasks=n_tasks)
    if export is not None:
        Console().print(f"wrote {export_tasks(tasks.tasks, export)} tasks to {export}")
        return None
    if not proxy:
        raise UserError("--proxy URL is required (or --export-tasks FILE)")
    return tasks


def model_name(proxy: str, model: str | None) -> str:
    client = make_client(proxy.rstrip("/") + "/v1", default_key(proxy) or "harnessrl")  # the operator's key
    try:
        return resolve_model(client, model)
    finally:
        client.close()
