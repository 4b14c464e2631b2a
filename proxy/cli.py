"""Sub-commands of this part of harnessrl (registered on the main `harnessrl` app)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import typer


def register(app: typer.Typer, ui: Callable[[str, str | None, str | None], Any] | None = None) -> None:
    """Add this part's commands to the main app. `ui(db, tokenizer, api_key)`: the trace viewer's
    ASGI app, given by the app layer (the proxy imports no other part), served at /ui/ unless
    `--no-ui`; with --api-key the viewer asks for that key (its sign-in page)."""

    @app.command("proxy")
    def proxy(
        db: str = typer.Option("runs.db", "--db", help="Records DB: SQLite path or postgresql+psycopg:// URL."),
        upstream: list[str] = typer.Option(None, "--upstream", metavar="URL", help="Server to forward to: vLLM or any "
                                           "OpenAI-compatible one, or a hosted model (see --upstream-dialect); "
                                           "http[s]://host[:port]. Repeat for several replicas (sticky sessions)."),
        upstreams_file: str = typer.Option(None, "--upstreams", help="File listing the upstream URLs, one a line "
                                           "(re-read on SIGHUP); instead of --upstream."),
        fail_after: int = typer.Option(3, "--fail-after", help="Several upstreams: consecutive connection errors "
                                       "or 5xx that take one out (probed back in with backoff)."),
        probe_interval: float = typer.Option(1.0, "--probe-interval", help="Several upstreams: first probe of a "
                                             "failed one after this many seconds (doubling to 30)."),
        push_mode: str = typer.Option("rolling", "--push-mode", help="Several upstreams: a weight push reloads "
                                      "them 'rolling' (one at a time) or 'all' at once."),
        drain_timeout: float = typer.Option(60.0, "--drain-timeout", help="Several upstreams: seconds a push waits "
                                            "for an upstream's calls in flight before reloading it."),
        push_wait: float = typer.Option(30.0, "--push-wait", help="Several upstreams: seconds a call waits for its "
                                        "reloading upstream before a retryable 503 with Retry-After (0: at once)."),
        upstream_dialect: str = typer.Option("openai-chat", "--upstream-dialect", help="What the upstream speaks: "
                                             "openai-chat (vLLM: token ids, trainable) | openai-responses | anthropic "
                                             "(text only: expert traces, never RL samples)."),
        upstream_model: str = typer.Option(None, "--upstream-model", help="Model name sent to the upstream, "
                                           "whatever the harness asks for (a hosted teacher's model; with --prefix, "
                                           "default: the upstream's own, from its /v1/models)."),
        upstream_ca: str = typer.Option(None, "--upstream-ca", help="CA certificate file to verify an https:// "
                                        "upstream with (default: the system's CA store)."),
        backend: str = typer.Option("upstream", "--backend", help="'upstream' or 'local' (transformers in-process)."),
        model: str = typer.Option(None, "--model", help="Checkpoint directory for --backend local."),
        tokenizer: str = typer.Option(None, "--tokenizer", help="Tokenizer directory (needed for --prefix with an upstream)."),
        prefix: bool = typer.Option(None, "--prefix/--no-prefix",
                                    help="Prefix-consistent prompts (default: on for local, off for upstream)."),
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
        port: int = typer.Option(8000, "--port", help="Port to listen on (0: a free one)."),
        api_key: str = typer.Option(None, "--api-key", envvar="HARNESSRL_PROXY_API_KEY",
                                    help="Require this key from clients (Authorization: Bearer KEY)."),
        upstream_api_key: str = typer.Option(None, "--upstream-api-key", envvar="HARNESSRL_UPSTREAM_API_KEY",
                                             help="Send this key to the upstream (a vLLM started with --api-key, a "
                                             "hosted provider): as a bearer token, or x-api-key for anthropic."),
        max_body_mb: float = typer.Option(32.0, "--max-body-mb", help="Largest request body accepted (any route), in MiB."),
        max_metadata_kb: float = typer.Option(64.0, "--max-metadata-kb",
                                              help="Largest rollout or reward metadata accepted (as JSON), in KiB."),
        timeout: float = typer.Option(600.0, "--timeout", help="Upstream timeout in seconds."),
        served_model_name: str = typer.Option(None, "--served-model-name", help="Model name to report and forward."),
        seed: int = typer.Option(0, "--seed", help="Sampling seed of the local backend."),
        log_level: str = typer.Option("warning", "--log-level", help="Log level (info: a line per call)."),
        log_format: str = typer.Option("text", "--log-format", help="'text' or 'json' (one JSON object a line, "
                                       "with the call id on lines about a call)."),
        strict_rollouts: bool = typer.Option(False, "--strict-rollouts", help="Refuse calls to a rollout id that "
                                             "does not exist (404) instead of creating it on first use."),
        strict_tools: bool = typer.Option(False, "--strict-tools", help="Refuse (400) a Responses or Messages "
                                          "request that declares a hosted tool (web_search, code_execution, ...) "
                                          "instead of removing the tool and recording its removal."),
        prefix_cache_mb: float = typer.Option(256.0, "--prefix-cache-mb", help="Memory bound of the prefix index "
                                              "(recent calls per session, for prefix-consistent prompts), MiB."),
        volatile_pattern: list[str] = typer.Option(None, "--volatile-pattern", metavar="REGEX", help="A prompt "
                                                   "span the harness changes every call (a hash, a timestamp), "
                                                   "besides the built-in ones such as Claude Code's cch=: with "
                                                   "--prefix a session's later calls get the earlier value, so "
                                                   "their prompts extend. Repeatable."),
        db_lock_timeout: float = typer.Option(5.0, "--db-lock-timeout", help="PostgreSQL: seconds a statement "
                                              "may wait for a lock (and a call for its locked rollout row)."),
        db_statement_timeout: float = typer.Option(30.0, "--db-statement-timeout",
                                                   help="PostgreSQL: seconds a statement may run."),
        spill_dir: str = typer.Option(None, "--spill-dir", help="Folder for the failed-call journal: calls "
                                      "answered 503 while the records DB is away, written to it once it is back "
                                      "(also after a crash, by the next proxy on the DB). Default: DB-spill/ "
                                      "beside a SQLite file; ~/.local/state/harnessrl/spill for PostgreSQL."),
        spill_max_mb: float = typer.Option(1024.0, "--spill-max-mb", help="Bound of the failed-call journal, MiB: "
                                           "while it is full, new model calls are refused with 503 (retryable), "
                                           "so no failed call is dropped."),
        sampling_policy: str = typer.Option(None, "--sampling-policy", help="YAML file of sampling parameters "
                                            "enforced on every call (temperature, top_p, max_tokens cap, forbidden "
                                            "ones such as logit_bias); the record keeps what the harness asked."),
        workers: int = typer.Option(1, "--workers", help="Proxy processes sharing the port and the records DB "
                                    "(one upstream, pass-through): each uses up to one core. The prefix index, "
                                    "rollout-status cache and /metrics are per process."),
        no_ui: bool = typer.Option(False, "--no-ui", help="Do not serve the trace viewer at /ui/ (with --api-key "
                                   "it asks for that key: a browser signs in once)."),
    ) -> None:
        """Run the recording proxy: an OpenAI-compatible endpoint that records every call."""
        from rich.console import Console

        from harnessrl.proxy.logs import configure
        from harnessrl.proxy.server import ProxyConfig, serve

        from harnessrl.db import shown_db
        from harnessrl.errors import UserError

        if api_key is None and os.environ.get("HARNESSRL_PROXY_API_KEY") == "":
            api_key = ""  # an empty variable must not silently turn authentication off: check() refuses it
        if upstream_api_key is None and os.environ.get("HARNESSRL_UPSTREAM_API_KEY") == "":
            upstream_api_key = ""  # likewise refused: a typo in a deployment must not go unnoticed
        if (upstream or upstreams_file) and backend == "local":
            raise UserError("give either --upstream URL or --backend local --model PATH, not both")
        if upstream and upstreams_file:
            raise UserError("give either --upstream URL (repeatable) or --upstreams FILE, not both")
        cfg = ProxyConfig(db=db, backend=backend, upstream=upstream[0] if upstream else None,
                          upstreams=tuple(upstream or ()), upstreams_file=upstreams_file, fail_after=fail_after,
                          probe_s=probe_interval, push_mode=push_mode, drain_timeout_s=drain_timeout,
                          push_wait_s=push_wait, sampling_policy=sampling_policy, model=model, tokenizer=tokenizer, prefix=prefix,
                          host=host, port=port, api_key=api_key, upstream_api_key=upstream_api_key,
                          upstream_dialect=upstream_dialect, upstream_ca=upstream_ca, upstream_model=upstream_model,
                          max_body_bytes=int(max_body_mb * 1024 * 1024),
                          max_metadata_bytes=int(max_metadata_kb * 1024),
                          upstream_timeout=timeout, served_model_name=served_model_name, seed=seed,
                          log_level=log_level, log_format=log_format, strict_rollouts=strict_rollouts,
                          strict_tools=strict_tools,
                          prefix_cache_bytes=int(prefix_cache_mb * 1024 * 1024),
                          volatile_patterns=tuple(volatile_pattern or ()), db_lock_timeout_s=db_lock_timeout,
                          db_statement_timeout_s=db_statement_timeout, workers=workers, spill_dir=spill_dir,
                          spill_max_bytes=int(spill_max_mb * 1024 * 1024))
        cfg.check()
        log_config = configure(log_format, log_level)
        target = ", ".join(cfg.upstreams or (cfg.upstream,)) if backend == "upstream" else f"local model {model}"
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
        serve(cfg, (lambda: {"/ui": ui(db, model or tokenizer, api_key)}) if with_ui else None, log_config)
