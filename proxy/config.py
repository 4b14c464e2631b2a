"""Proxy settings: the `harnessrl proxy` flags, each defined once here with its help."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harnessrl.cli_options import option
from harnessrl.errors import UserError


DIALECTS = ("openai-chat", "openai-responses", "anthropic")


MiB, KiB = 1024 * 1024, 1024
UPSTREAM, RECORDS, SERVING, SEVERAL = "Upstream", "Records", "Serving", "Several upstreams"
LIMITS, SECURITY, LOGGING = "Limits", "Security", "Logging"


@dataclass
class ProxyConfig:
    """The proxy's settings; each flagged field is a `harnessrl proxy` option (`harnessrl.cli_options`)."""

    # several upstreams (`upstream/ring.py`): every URL (`--upstream` given more than once), or a file
    # listing them (re-read on SIGHUP); `upstream` is then the first
    upstreams: tuple[str, ...] = option(
        (), "--upstream", metavar="URL", panel=UPSTREAM,
        help="Server to forward to: vLLM or any OpenAI-compatible one, or a hosted model (see --upstream-dialect); "
        "http://host[:port] or https://… Repeat for several replicas (sticky sessions).")
    # what the upstream speaks: openai-chat (vLLM, token ids) | openai-responses | anthropic (hosted
    # models: text only, recorded with prompt_path text-only and never trained on)
    upstream_dialect: str = option(
        "openai-chat", panel=UPSTREAM, help="What the upstream speaks: openai-chat (vLLM: token ids, trainable) | "
        "openai-responses | anthropic (text only: expert traces, never RL samples).")
    upstream_model: str | None = option(  # the model name sent upstream, whatever the harness asked (a hosted teacher)
        None, panel=UPSTREAM, help="Model name sent to the upstream, whatever the harness asks for (a hosted teacher's "
        "model; with --prefix, default: the upstream's own, from its /v1/models).")
    upstream_timeout: float = option(600.0, "--timeout", panel=UPSTREAM, help="Upstream timeout in seconds.")
    backend: str = option(  # "upstream" (an OpenAI-compatible server, vLLM) | "local" (in-process)
        "upstream", panel=UPSTREAM, help="'upstream' or 'local' (transformers in-process).")
    model: str | None = option(None, panel=UPSTREAM, help="Checkpoint directory for --backend local.")
    tokenizer: str | None = option(  # upstream prefix mode: tokenizer/chat-template directory
        None, panel=UPSTREAM, help="Tokenizer directory (needed for --prefix with an upstream).")
    served_model_name: str | None = option(None, panel=UPSTREAM, help="Model name to report and forward.")
    seed: int = option(0, panel=UPSTREAM, help="Sampling seed of the local backend.")
    db: str = option("runs.db", panel=RECORDS, help="Records DB: SQLite path or postgresql+psycopg:// URL.")
    db_lock_timeout_s: float = option(  # also how long a call waits on a locked rollout row
        5.0, "--db-lock-timeout", panel=RECORDS,
        help="PostgreSQL: seconds a statement may wait for a lock (and a call for its locked rollout row).")
    db_statement_timeout_s: float = option(30.0, "--db-statement-timeout", panel=RECORDS,
                                           help="PostgreSQL: seconds a statement may run.")
    # the failed-call journal (`record/failed_call_journal.py`): calls answered 503 while the DB is away,
    # written once it is back. None: `DB-spill/` beside a SQLite file, else ~/.local/state/harnessrl/spill
    # (a folder per DB)
    spill_dir: str | None = option(
        None, panel=RECORDS, help="Folder for the failed-call journal: calls answered 503 while the records DB is "
        "away, written to it once it is back (also after a crash, by the next proxy on the DB). Default: DB-spill/ "
        "beside a SQLite file; ~/.local/state/harnessrl/spill for PostgreSQL.")
    spill_max_bytes: int = option(  # at this many bytes waiting, new calls are refused with 503
        1024 * MiB, "--spill-max-mb", scale=MiB, panel=RECORDS,
        help="Bound of the failed-call journal, MiB: while it is full, new model calls are refused with 503 "
        "(retryable), so no failed call is dropped.")
    strict_rollouts: bool = option(  # a call to an unknown rollout id: 404 instead of creating it
        False, panel=RECORDS,
        help="Refuse calls to a rollout id that does not exist (404) instead of creating it on first use.")
    rollout_idle_s: float = option(  # `rollouts/idle.py`
        3600.0, "--rollout-idle", panel=RECORDS,
        help="Seconds without a call or reward after which a rollout created on first use (named only by its URL "
        "path, header or key, so nobody finishes it) is finished, with finished_by: idle in its metadata; its outcome "
        "can still be reported (harnessrl reward). 0: never.")
    host: str = option("127.0.0.1", panel=SERVING, help="Address to listen on.")
    port: int = option(8000, panel=SERVING, help="Port to listen on (0: a free one).")
    # proxy processes sharing the listening socket and the records DB (`workers.py`): one upstream
    # and no local backend, since the prefix index, weight pushes and upstream health are per process
    workers: int = option(
        1, panel=SERVING, help="Proxy processes sharing the port and the records DB (one upstream, pass-through): "
        "each uses up to one core. The prefix index, rollout-status cache and /metrics are per process.")
    prefix: bool | None = option(  # prefix-consistent prompts; default on for local, off for upstream
        None, "--prefix/--no-prefix", panel=SERVING,
        help="Prefix-consistent prompts (default: on for local, off for upstream).")
    prefix_cache_bytes: int = option(  # the prefix index's memory bound
        256 * MiB, "--prefix-cache-mb", scale=MiB, panel=SERVING,
        help="Memory bound of the prefix index (recent calls per session, for prefix-consistent prompts), MiB.")
    # regexes of prompt spans a harness changes every call (beyond the built-in rules of `prefix/volatile.py`):
    # in prefix mode a session's later calls are sent the earlier values; agent fingerprints ignore them
    volatile_patterns: tuple[str, ...] = option(
        (), "--volatile-pattern", metavar="REGEX", panel=SERVING,
        help="A prompt span the harness changes every call (a hash, a timestamp), besides the built-in ones such as "
        "Claude Code's cch=: with --prefix a session's later calls get the earlier value, so their prompts extend. "
        "Repeatable.")
    # regexes of earlier replies a harness sends back in a form of its own (beyond the built-in rules of
    # `prefix/rewrites.py`): in prefix mode the model is sent the turn it wrote, so the session merges
    rewrite_patterns: tuple[str, ...] = option(
        (), "--rewrite-pattern", metavar="REGEX", panel=SERVING,
        help="How the harness re-sends the model's earlier turn as text of its own (besides the built-in smolagents "
        "rules): a regex over that assistant message with groups text (the model's text) and optionally calls "
        "(its tool calls as a JSON or Python list) and appended (text the harness adds). With --prefix the model "
        "is sent its own turn, so the session merges. Repeatable.")
    sampling_policy: str | None = option(  # YAML file (`harnessrl.sampling_policy`): enforced on every call
        None, panel=SERVING, help="YAML file of sampling parameters enforced on every call (temperature, top_p, "
        "max_tokens cap, forbidden ones such as logit_bias); the record keeps what the harness asked.")
    upstreams_file: str | None = option(
        None, "--upstreams", panel=SEVERAL,
        help="File listing the upstream URLs, one a line (re-read on SIGHUP); instead of --upstream.")
    fail_after: int = option(  # consecutive connection errors / 5xx that take an upstream out
        3, panel=SEVERAL, help="Several upstreams: consecutive connection errors or 5xx that take one out (probed "
        "back in with backoff).")
    probe_s: float = option(  # first probe of a failed upstream after this; doubles to 30 s
        1.0, "--probe-interval", panel=SEVERAL,
        help="Several upstreams: first probe of a failed one after this many seconds (doubling to 30).")
    push_mode: str = option(  # weight push to several upstreams: "rolling" (one at a time) | "all"
        "rolling", panel=SEVERAL,
        help="Several upstreams: a weight push reloads them 'rolling' (one at a time) or 'all' at once.")
    drain_timeout_s: float = option(  # how long a push waits for an upstream's calls in flight
        60.0, "--drain-timeout", panel=SEVERAL,
        help="Several upstreams: seconds a push waits for an upstream's calls in flight before reloading it.")
    push_wait_s: float = option(  # how long a call waits for its reloading upstream before a 503 + Retry-After
        30.0, "--push-wait", panel=SEVERAL, help="Several upstreams: seconds a call waits for its reloading upstream "
        "before a retryable 503 with Retry-After (0: at once).")
    max_body_bytes: int = option(32 * MiB, "--max-body-mb", scale=MiB, panel=LIMITS,  # every route
                                 help="Largest request body accepted (any route), in MiB.")
    max_metadata_bytes: int = option(64 * KiB, "--max-metadata-kb", scale=KiB, panel=LIMITS,  # as JSON
                                     help="Largest rollout or reward metadata accepted (as JSON), in KiB.")
    # a hosted tool (web search, code execution: run inside the provider's API) in a Responses or
    # Messages request: refused with a 400 instead of removed from what the model sees (`surfaces/hosted_tools.py`)
    strict_tools: bool = option(
        False, panel=LIMITS, help="Refuse (400) a Responses or Messages request that declares a hosted tool "
        "(web_search, code_execution, ...) instead of removing the tool and recording its removal.")
    api_key: str | None = option(  # required from clients when set
        None, envvar="HARNESSRL_PROXY_API_KEY", panel=SECURITY,
        help="Require this key from clients (Authorization: Bearer KEY).")
    upstream_api_key: str | None = option(  # sent to the upstream (a vLLM started with --api-key); never recorded
        None, envvar="HARNESSRL_UPSTREAM_API_KEY", panel=SECURITY,
        help="Send this key to the upstream (a vLLM started with --api-key, a hosted provider): as a bearer token, "
        "or x-api-key for anthropic.")
    upstream_ca: str | None = option(  # CA file for an https:// upstream (default: the system's store)
        None, panel=SECURITY,
        help="CA certificate file to verify an https:// upstream with (default: the system's CA store).")
    log_level: str = option("warning", panel=LOGGING, help="Log level (info: a line per call).")
    log_format: str = option(  # "text" | "json" (one JSON object a line, with the call id)
        "text", panel=LOGGING, help="'text' or 'json' (one JSON object a line, with the call id on lines about a call).")
    # settings without a flag (set by library callers and tests)
    upstream: str | None = None  # http://host:port of the upstream; `check` sets it to the first of `upstreams`
    default_max_tokens: int = 256
    # upstream weight pushes: (checkpoint dir, version or None) -> new version; without it 400
    reload_hook: Callable[[str, str | None], str] | None = None

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
        from harnessrl.proxy.prefix.rewrites import check_pattern as check_rewrite

        for pattern in self.rewrite_patterns:
            check_rewrite(pattern)
        if not self.rollout_idle_s >= 0:
            raise UserError("--rollout-idle must be >= 0 (0: never finish idle rollouts)")
        if self.prefix_cache_bytes < 0:
            raise UserError("--prefix-cache-mb must be >= 0")
        if self.max_body_bytes <= 0:
            raise UserError("--max-body-mb must be positive")
        if self.spill_max_bytes <= 0:
            raise UserError("--spill-max-mb must be positive")
        if self.max_metadata_bytes <= 0:
            raise UserError("--max-metadata-kb must be positive")
