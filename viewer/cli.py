"""`harnessrl ui`: the trace viewer on its own server (the running proxy also serves it at `/ui/`)."""

from __future__ import annotations

from pathlib import Path

import typer


def ui_cmd(
    db: str = typer.Option("runs.db", "--db", help="Records DB: SQLite path or postgresql+psycopg:// URL."),
    samples: Path | None = typer.Option(None, "--samples", help="A compile output directory: show loss masks and advantages."),
    loop: Path | None = typer.Option(None, "--loop", help="A `harnessrl loop` output directory: the runs page."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="Tokenizer directory (default: the recorded model dir, else the --loop checkpoint)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8765, "--port", help="Port to listen on."),
) -> None:
    """Serve the trace viewer: rollouts, session prefix trees, token classes, rewards and advantages."""
    import socket

    import uvicorn
    from rich.console import Console

    from harnessrl.errors import UserError
    from harnessrl.viewer.app import create_viewer, standalone

    app = standalone(create_viewer(db, samples=samples, loop=loop, tokenizer=tokenizer))
    try:
        sock = socket.create_server((host, port))
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    Console(stderr=True).print(f"harnessrl viewer on http://{host}:{port}/ui/ — records from {db}")
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


def register(app: typer.Typer) -> None:
    """Add this part's commands to the main app."""
    app.command("ui")(ui_cmd)
