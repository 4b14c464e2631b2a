"""What the proxy runs between startup and shutdown: the recorder, the upstream pool (or the ring
of several), and `Serving` over the one route chosen for the configuration. The endpoints read
them from the `Lifespan` object; FastAPI enters it on startup and leaves it on shutdown."""

from __future__ import annotations

import asyncio
import gc
import threading
from contextlib import asynccontextmanager

from sqlalchemy import Engine

from harnessrl.proxy.config import ProxyConfig
from harnessrl.proxy.fanout import handle_n
from harnessrl.proxy.prefix.prompts import Prompter
from harnessrl.proxy.prefix.rewrites import Rewrites
from harnessrl.proxy.prefix.volatile import Volatile
from harnessrl.proxy.prometheus import ProxyMetrics
from harnessrl.proxy.protocol import Route
from harnessrl.proxy.record.failed_call_journal import default_dir
from harnessrl.proxy.record.recorder import Recorder
from harnessrl.proxy.rollouts.idle import finish_idle_rollouts
from harnessrl.proxy.rollouts.status import RolloutStatus
from harnessrl.proxy.routes.passthrough import PassThroughRoute
from harnessrl.proxy.routes.text import TextOnlyRoute
from harnessrl.proxy.routes.token_backend import TokenBackend
from harnessrl.proxy.routes.tokens import TokenRoute
from harnessrl.proxy.serving import Serving
from harnessrl.proxy.surfaces.embeddings import serve_embeddings
from harnessrl.proxy.upstream.anthropic import ANTHROPIC_DIALECT
from harnessrl.proxy.upstream.http_pool import Pool, credential_headers
from harnessrl.proxy.upstream.openai_responses import RESPONSES_DIALECT
from harnessrl.proxy.upstream.ring import Upstreams
from harnessrl.proxy.upstream.ring_life import start_upstreams, stop_upstreams
from harnessrl.proxy.upstream.vllm_tokens import UpstreamTokens

GC_GEN0 = 20_000


class FrozenGC:
    """The collector while any proxy of this process serves. What exists at a start (modules, the
    app, the tokenizer) lives as long as the server: frozen, the collector stops walking it on
    every collection that the hot path's short-lived JSON objects set off (~8% of the hot path's
    CPU in a profile). Under load the calls in flight hold thousands of young containers (parsed
    bodies, one dict per log-prob), so at the default gen-0 threshold (700) a collection ran every
    ~18 calls and walked them all: ~15 µs a call at 64 clients. At 20,000 one runs only when
    objects really accumulate (the prefix index grows slowly); older generations as before.

    When the last server stops, the process (an embedded proxy's: a test, `run`, `loop`) goes on
    or ends: everything is thawed and the threshold restored. Objects left frozen are never
    freed, and triton's (imported with any transformers model) then printed nanobind's leak
    report, ~40 lines, at the exit of every such command."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # embedded proxies start and stop on their own threads
        self._serving = 0
        self._threshold = gc.get_threshold()

    def start(self) -> None:
        with self._lock:
            if not self._serving:
                self._threshold = gc.get_threshold()
                gc.set_threshold(GC_GEN0, *self._threshold[1:])
            self._serving += 1
            gc.freeze()

    def stop(self) -> None:
        with self._lock:
            self._serving -= 1
            if not self._serving:
                gc.unfreeze()
                gc.set_threshold(*self._threshold)


FROZEN_GC = FrozenGC()


def choose_route(cfg: ProxyConfig, backend: TokenBackend | None, pool: Pool | None) -> Route:
    """The local backend's token route, an upstream's token route (prefix mode), pass-through, or
    a text-only route to a hosted model that speaks another dialect."""
    if backend is not None:
        prompter = Prompter(backend.tokenizer, cfg.prefix_mode, render_ids=backend.render)
        return TokenRoute(backend, prompter, backend.model_name, cfg.default_max_tokens)
    assert pool is not None  # cfg.check(): an upstream backend has an upstream URL
    name = cfg.served_model_name or "model"
    if cfg.upstream_dialect == "anthropic":
        return TextOnlyRoute(ANTHROPIC_DIALECT, pool, name, cfg.default_max_tokens, cfg.upstream_model)
    if cfg.upstream_dialect == "openai-responses":
        return TextOnlyRoute(RESPONSES_DIALECT, pool, name, cfg.default_max_tokens, cfg.upstream_model)
    if cfg.prefix_mode:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(cfg.tokenizer)
        return TokenRoute(UpstreamTokens(pool, tok, name, cfg.upstream_model),  # type: ignore[arg-type]
                          Prompter(tok, True), name, cfg.default_max_tokens)
    return PassThroughRoute(pool, name, cfg.upstream_model)


class Lifespan:
    """The app's lifespan (`FastAPI(lifespan=...)`) and what it started. The attributes are None
    until startup: they open sockets and threads that must belong to the server's event loop."""

    def __init__(self, cfg: ProxyConfig, backend: TokenBackend | None, engine: Engine, metrics: ProxyMetrics,
                 statuses: RolloutStatus) -> None:
        self.cfg, self.backend, self.engine, self.metrics, self.statuses = cfg, backend, engine, metrics, statuses
        self.serving: Serving | None = None
        self.recorder: Recorder | None = None
        self.pool: Pool | None = None  # the upstream's pool; with several, the first one's
        self.upstreams: Upstreams | None = None  # several upstreams: the ring

    @asynccontextmanager
    async def __call__(self, _app):
        self._start()
        FROZEN_GC.start()
        idle = (asyncio.create_task(finish_idle_rollouts(self.cfg.rollout_idle_s, self.statuses, self.serving.index))
                if self.cfg.rollout_idle_s > 0 else None)
        try:
            yield
        finally:
            if idle is not None:
                idle.cancel()
                await asyncio.gather(idle, return_exceptions=True)  # a sweep in its thread ends first
            self._stop()
            FROZEN_GC.stop()

    def _pool(self, url: str) -> Pool:
        cfg = self.cfg
        return Pool(url, timeout=cfg.upstream_timeout, ca_file=cfg.upstream_ca,
                    credentials=credential_headers(cfg.upstream_dialect, cfg.upstream_api_key))

    def _start(self) -> None:
        cfg, metrics = self.cfg, self.metrics
        recorder = Recorder(self.engine, busy_s=cfg.db_lock_timeout_s, metrics=metrics,
                            spill_dir=default_dir(self.engine.url, cfg.spill_dir), spill_max_bytes=cfg.spill_max_bytes)
        ups = start_upstreams(cfg, self._pool, metrics.registry) if cfg.several else None
        pool = ups.all[0].pool if ups is not None else self._pool(cfg.upstream) if cfg.upstream else None
        # embeddings and n > 1 are served beside the one-call path; wired here so that `serving`
        # needs neither module (both use its public recording API)
        serving = Serving(choose_route(cfg, self.backend, pool), recorder, self.statuses, cfg.prefix_cache_bytes,
                          metrics, Volatile(cfg.volatile_patterns), hold=cfg.prefix_mode,
                          embeddings=serve_embeddings, fanout=handle_n, rewrites=Rewrites(cfg.rewrite_patterns))
        metrics.watch(lambda: recorder.queue_depth, lambda: serving.index.nbytes)
        self.serving, self.recorder, self.pool, self.upstreams = serving, recorder, pool, ups

    def _stop(self) -> None:
        if self.upstreams is not None:
            stop_upstreams(self.upstreams)
        elif self.pool is not None:
            self.pool.close()
        if self.recorder is not None:
            self.recorder.close()
        self.engine.dispose()
