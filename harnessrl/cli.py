"""The `harnessrl` command. Each part registers its own sub-commands (`<part>/cli.py`);
heavy imports (torch, transformers) happen inside the commands so `--help` stays fast."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import typer
from rich.console import Console

from harnessrl.errors import UserError

app = typer.Typer(
    help="harnessrl: record any agent harness through an OpenAI-compatible proxy, compile RL samples, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Records DB maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")

_PARTS = (
    "harnessrl.proxy.cli",
    "harnessrl.compiler.cli",
    "harnessrl.trainer.cli",
    "harnessrl.harness_examples.cli",
)


@app.command("tiny-model")
def tiny_model(
    out_dir: Path = typer.Argument(..., help="Directory to write the tiny model and tokenizer to."),
    seed: int = typer.Option(0, help="Seed for the tokenizer corpus and the weights."),
) -> None:
    """Build the tiny Qwen2-architecture test model and its tokenizer, offline and deterministically."""
    from harnessrl.tiny_model import build_tiny_model

    path = build_tiny_model(out_dir, seed=seed)
    Console().print(f"tiny model written to [bold]{path}[/bold]")


@db_app.command("upgrade")
def db_upgrade(
    db: str = typer.Option("runs.db", "--db", help="SQLite path or postgresql+psycopg:// URL."),
) -> None:
    """Create the records DB or migrate it to the newest schema."""
    from harnessrl.db import make_engine, upgrade

    upgrade(make_engine(db))
    Console().print(f"records DB at head: {db}")


for _part in _PARTS:
    importlib.import_module(_part).register(app)


def main() -> None:
    try:
        app()
    except UserError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
