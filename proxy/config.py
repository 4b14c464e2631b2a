"""Proxy settings (the `harnessrl proxy` flags)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harnessrl.errors import UserError


DIALECTS = ("openai-chat", "openai-responses", "anthropic")


@dataclass
class ProxyConfig:
    db: str = "runs.db"  # SQLite path or postgresql+psycopg:// URL
    backend: str = "upstream"  # "upstream" (an OpenAI-compatible server, vLLM) | "local" (in-process)
    upstream: str | None = None  # http://host:port of the upstream
    model: str | None = None  # local: checkpoint directory
    tokenizer: str | None = None  # upstream prefix mode: tokenizer/chat-template directory
    prefix: bool | None = None  # prefix-consistent prompts; default on for local, off for upstream
    host: str = "127.0.0.1"
    port: int = 8000  # 0: a free port
    api_key: str | None = None  # required from clients when set
    upstream_api_key: str | None = None  # sent to the upstream (a vLLM started with --api-key); never recorded
    # what the upstream speaks: openai-chat (vLLM, token ids) | openai-responses | anthropic (hosted
    # models: text only, recorded with prompt_path text-only and never trained on)
    upstream_dialect: str = "openai-chat"
    upstream_ca: str | None = None  # CA file for an https:// upstream (default: the system's store)
    upstream_model: str | None = None  # the model name sent upstream, whatever the harness asked (a hosted teacher)
    max_body_bytes: int = 32 * 1024 * 1024  # every route
    max_metadata_bytes: int = 64 * 1024  # rollout and reward metadata, as JSON
    upstream_timeout: float = 600.0  # seconds
    default_max_tokens: int = 256
    served_model_name: str | None = None
    seed: int = 0  # local backend sampling seed
    # upstream weight pushes: (checkpoint dir, version or None) -> new version; without it 400
    reload_hook: Callable[[str, str | None], str] | None = None
    log_level: str = "warning"
    log_format: str = "text"  # "text" | "json" (one JSON object a line, with the call id)
    strict_rollouts: bool = False  # a call to an unknown rollout id: 404 instead of creating it
    # a hosted tool (web search, code execution: run inside the provider's API) in a Responses or
    # Messages request: refused with a 400 instead of removed from what the model sees (`surface_tools`)
    strict_tools: bool = False
    db_lock_timeout_s: float = 5.0  # PostgreSQL lock_timeout; also how long a call waits on a locked rollout row
    db_statement_timeout_s: float = 30.0  # PostgreSQL statement_timeout
    # the failed-call journal (`spill.py`): calls answered 503 while the DB is away, written once it
    # is back. None: `DB-spill/` beside a SQLite file, else ~/.local/state/harnessrl/spill (a folder per DB)
    spill_dir: str | None = None
    spill_max_bytes: int = 1024 * 1024 * 1024  # at this many bytes waiting, new calls are refused with 503
    prefix_cache_bytes: int = 256 * 1024 * 1024  # the prefix index's memory bound
    # regexes of prompt spans a harness changes every call (beyond the built-in rules of `volatile.py`):
    # in prefix mode a session's later calls are sent the earlier values; agent fingerprints ignore them
    volatile_patterns: tuple[str, ...] = ()
    # several upstreams (`upstreams.py`): every URL (`--upstream` given more than once), or a file
    # listing them (re-read on SIGHUP); `upstream` is then the first
    upstreams: tuple[str, ...] = ()
    upstreams_file: str | None = None
    fail_after: int = 3  # consecutive connection errors / 5xx that take an upstream out
    probe_s: float = 1.0  # first probe of a failed upstream after this; doubles to 30 s
    push_mode: str = "rolling"  # weight push to several upstreams: "rolling" (one at a time) | "all"
    drain_timeout_s: float = 60.0  # how long a push waits for an upstream's calls in flight
    push_wait_s: float = 30.0  # how long a call waits for its reloading upstream before a 503 + Retry-After
    sampling_policy: str | None = None  # YAML file (`harnessrl.sampling_policy`): enforced on every call
    # proxy processes sharing the listening socket and the records DB (`workers.py`): one upstream
    # and no local backend, since the prefix index, weight pushes and upstream health are per process
    workers: int = 1

    @property
    def several(self) -> bool:
        """Whether calls are spread over several upstreams (an `Upstreams` ring, not one pool)."""
        return self.backend == "upstream" and (len(self.upstreams) > 1 or self.upstreams_file is not None)

    @property
    def prefix_mode(self) -> bool:
        return self.prefix if self.prefix is not None else self.backend == "local"

    def check(self) -> None:
        if self.backend not in ("upstream", "local"):
            raise UserError(f"--backend must be 'upstream' or 'local', got {self.backend!r}")
        if self.backend == "upstream":
            if self.upstreams_file is not None:
                from harnessrl.proxy.upstream.ring import read_upstreams_file

                self.upstreams = tuple(read_upstreams_file(self.upstreams_file))
                if not self.upstreams:
                    raise UserError(f"--upstreams: {self.upstreams_file} lists no upstream URL")
            if self.upstreams:
                for url in self.upstreams:
                    if not url.startswith(("http://", "https://")):
                        raise UserError(f"--upstream must be an http:// or https:// URL, got {url!r}")
                self.upstream = self.upstreams[0]
            if self.push_mode not in ("rolling", "all"):
                raise UserError(f"--push-mode must be 'rolling' or 'all', got {self.push_mode!r}")
            if self.fail_after < 1 or self.probe_s <= 0 or self.drain_timeout_s < 0 or self.push_wait_s < 0:
                raise UserError("--fail-after must be >= 1, --probe-interval > 0, --drain-timeout and --push-wait >= 0")
            if not self.upstream:
                raise UserError("give --upstream URL (an OpenAI-compatible server) or --backend local --model PATH")
            if not self.upstream.startswith(("http://", "https://")):
                raise UserError(f"--upstream must be an http:// or https:// URL, got {self.upstream!r}")
            if self.upstream_dialect not in DIALECTS:
                raise UserError(f"--upstream-dialect must be one of {', '.join(DIALECTS)}, got {self.upstream_dialect!r}")
            if self.upstream_dialect != "openai-chat" and self.prefix_mode:
                raise UserError(f"--prefix needs token ids from the upstream; the {self.upstream_dialect} dialect "
                                "returns text only")
            if self.upstream_ca is not None and not Path(self.upstream_ca).is_file():
                raise UserError(f"--upstream-ca: file not found: {self.upstream_ca}")
            # OpenAI's convention is a base URL ending in /v1; the proxy adds /v1/... itself
            self.upstream = self.upstream.rstrip("/").removesuffix("/v1")
            if self.prefix_mode and not self.tokenizer:
                raise UserError("prefix-consistent mode with an upstream needs --tokenizer DIR (the model's tokenizer)")
        elif not self.model:
            raise UserError("--backend local needs --model PATH (a checkpoint directory)")
        if self.api_key is not None and not self.api_key.strip():
            raise UserError("the proxy API key is empty (--api-key or HARNESSRL_PROXY_API_KEY): set a key, or unset "
                            "the variable to run without one")
        if self.upstream_api_key is not None:
            if self.backend != "upstream":
                raise UserError("--upstream-api-key is for --upstream servers, not --backend local")
            if not self.upstream_api_key.strip():
                raise UserError("the upstream API key is empty (--upstream-api-key or HARNESSRL_UPSTREAM_API_KEY): "
                                "set a key, or unset the variable to call the upstream without one")
            if not all("!" <= c <= "~" for c in self.upstream_api_key):
                # it goes into an HTTP header: no spaces, line breaks or non-ASCII
                raise UserError("the upstream API key may only hold printable ASCII characters, no spaces")
        if self.sampling_policy is not None:
            from harnessrl.sampling_policy import load_policy

            load_policy(self.sampling_policy)  # a bad file stops the start with its one-line reason
        if self.log_format not in ("text", "json"):
            raise UserError(f"--log-format must be 'text' or 'json', got {self.log_format!r}")
        if self.workers < 1:
            raise UserError("--workers must be >= 1")
        if self.workers > 1 and (self.backend != "upstream" or self.several or self.prefix_mode):
            raise UserError("--workers above 1 needs one --upstream in pass-through mode (a local backend, several "
                            "upstreams and --prefix keep per-process state that the workers would not share)")
        from harnessrl.proxy.prefix.volatile import check_pattern

        for pattern in self.volatile_patterns:
            check_pattern(pattern)
        if self.prefix_cache_bytes < 0:
            raise UserError("--prefix-cache-mb must be >= 0")
        if self.max_body_bytes <= 0:
            raise UserError("--max-body-mb must be positive")
        if self.spill_max_bytes <= 0:
            raise UserError("--spill-max-mb must be positive")
        if self.max_metadata_bytes <= 0:
            raise UserError("--max-metadata-kb must be positive")
