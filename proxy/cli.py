"""Sub-commands of this part of harnessrl (registered on the main `harnessrl` app)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import typer

from harnessrl.cli_options import from_config
from harnessrl.proxy.config import SERVING, ProxyConfig


def register(app: typer.Typer, ui: Callable[[str, str | None, str | None], Any] | None = None) -> None:
    """Add this part's commands to the main app. `ui(db, tokenizer, api_key)`: the trace viewer's
    ASGI app, given by the app layer (the proxy imports no other part), served at /ui/ unless
    `--no-ui`; with --api-key the viewer asks for that key (its sign-in page)."""

    @app.command("proxy")
    @from_config(ProxyConfig)
    def proxy(
        cfg: ProxyConfig,
        no_ui: bool = typer.Option(False, "--no-ui", rich_help_panel=SERVING, help="Do not serve the trace viewer at "
                                   "/ui/ (with --api-key it asks for that key: a browser signs in once)."),
    ) -> None:
        """Run the recording proxy: an OpenAI-compatible endpoint that records every call."""
        from harnessrl.console import Console

        from harnessrl.proxy.logs import configure
        from harnessrl.proxy.server import serve

        from harnessrl.db import shown_db
        from harnessrl.errors import UserError

        if cfg.api_key is None and os.environ.get("HARNESSRL_PROXY_API_KEY") == "":
            cfg.api_key = ""  # an empty variable must not silently turn authentication off: check() refuses it
        if cfg.upstream_api_key is None and os.environ.get("HARNESSRL_UPSTREAM_API_KEY") == "":
            cfg.upstream_api_key = ""  # likewise refused: a typo in a deployment must not go unnoticed
        if (cfg.upstreams or cfg.upstreams_file) and cfg.backend == "local":
            raise UserError("give either --upstream URL or --backend local --model PATH, not both")
        if cfg.upstreams and cfg.upstreams_file:
            raise UserError("give either --upstream URL (repeatable) or --upstreams FILE, not both")
        cfg.check()
        db, host, port, api_key, log_format = cfg.db, cfg.host, cfg.port, cfg.api_key, cfg.log_format
        log_config = configure(log_format, cfg.log_level)
        target = ", ".join(cfg.upstreams or (cfg.upstream,)) if cfg.backend == "upstream" else f"local model {cfg.model}"
        console = Console(stderr=True)
        say, warn = console.print, lambda msg: console.print(f"[yellow]warning:[/yellow] {msg}")
        if log_format == "json":  # every line on stderr is then a JSON object
            log = logging.getLogger("harnessrl.proxy")
            say, warn = (lambda msg: log.warning("%s", msg)), (lambda msg: log.warning("warning: %s", msg))
        if not api_key and host not in ("127.0.0.1", "localhost", "::1"):
            warn(f"listening on {host} without --api-key: anyone who can reach this port can make model calls and "
                 "read or write rollouts")
        say(f"harnessrl proxy on http://{host}:{port} → {target}; recording to {shown_db(db)}")
        with_ui = ui is not None and not no_ui
        if with_ui:
            say(f"trace viewer on http://{host}:{port}/ui/" + (" (sign in with the --api-key)" if api_key else ""))
        serve(cfg, (lambda: {"/ui": ui(db, cfg.model or cfg.tokenizer, api_key)}) if with_ui else None, log_config)
