"""`harnessrl ui`: the trace viewer on its own server (the running proxy also serves it at `/ui/`)."""

from __future__ import annotations

from pathlib import Path

import typer

from harnessrl.cli_options import records_db_option


def ui_cmd(
    db: str = records_db_option(),
    samples: Path | None = typer.Option(None, "--samples", help="A compile output directory: show loss masks and advantages."),
    loop: Path | None = typer.Option(None, "--loop", help="A `harnessrl loop` output directory: the runs page."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="Tokenizer directory (default: the recorded model dir, else the --loop checkpoint)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8765, "--port", help="Port to listen on."),
    api_key: str | None = typer.Option(None, "--api-key", envvar="HARNESSRL_UI_API_KEY",
                                       help="Require this key: a browser signs in once (the page asks, or open "
                                       "/ui/?key=KEY), scripts send Authorization: Bearer KEY."),
) -> None:
    """Serve the trace viewer: rollouts, session prefix trees, token classes, rewards and advantages."""
    import os
    import socket

    import uvicorn
    from harnessrl.console import Console

    from harnessrl.db import shown_db
    from harnessrl.errors import UserError
    from harnessrl.viewer.app import create_viewer, standalone

    if api_key is None and os.environ.get("HARNESSRL_UI_API_KEY") == "":
        api_key = ""
    if api_key == "":  # an empty variable must not silently turn the key off
        raise UserError("the viewer's API key is empty (--api-key or HARNESSRL_UI_API_KEY): give a key or neither")
    app = standalone(create_viewer(db, samples=samples, loop=loop, tokenizer=tokenizer, api_key=api_key))
    try:
        sock = socket.create_server((host, port))
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    console = Console(stderr=True)
    if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/yellow] listening on {host} without --api-key: anyone who can reach this "
                      "port can read every recorded prompt and answer")
    console.print(f"harnessrl viewer on http://{host}:{port}/ui/ — records from {shown_db(db)}"
                  + (" (sign in with the --api-key)" if api_key else ""), soft_wrap=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


def register(app: typer.Typer) -> None:
    """Add this part's commands to the main app."""
    app.command("ui")(ui_cmd)
