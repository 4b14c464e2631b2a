"""The proxy's ASGI app, assembled from its parts: the model endpoints (also under
/r/{rollout}/a/{agent}/v1, `model_endpoints`), the rollout API (`rollouts.api`), the weights
endpoint (`weights_api`), the surfaces' non-model endpoints, probes and metrics, and the
lifespan that starts serving (`lifespan`).

The model endpoints are the hot path: `ProxyApp` matches their path to an API adapter
(`ADAPTERS`) and hands the call straight to `ModelEndpoints.serve` — no FastAPI middleware,
routing or pydantic model; adapters check bodies by hand so any malformed request gets an error
in its API's shape. Everything else goes through FastAPI.
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI

from harnessrl.db import open_db
from harnessrl.proxy.config import ProxyConfig
from harnessrl.proxy.error_handlers import add_error_handlers
from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.identity import key_in_path
from harnessrl.proxy.lifespan import Lifespan
from harnessrl.proxy.limits import Guard
from harnessrl.proxy.model_endpoints import ModelEndpoints
from harnessrl.proxy.probes import add_metrics, add_probes
from harnessrl.proxy.prometheus import ProxyMetrics
from harnessrl.proxy.rollouts.api import add_rollout_api
from harnessrl.proxy.rollouts.status import RolloutStatus
from harnessrl.proxy.rollouts.store import Rollouts
from harnessrl.proxy.routes.token_backend import TokenBackend
from harnessrl.proxy.surfaces.adapter import Adapter
from harnessrl.proxy.surfaces.anthropic.wire import MESSAGES
from harnessrl.proxy.surfaces.embeddings import EMBEDDINGS
from harnessrl.proxy.surfaces.gemini.endpoints import GeminiEndpoints
from harnessrl.proxy.surfaces.gemini.wire import GEMINI
from harnessrl.proxy.surfaces.hosted_tools import strict
from harnessrl.proxy.surfaces.non_model_routes import add_surface_routes
from harnessrl.proxy.surfaces.openai_chat import CHAT_COMPLETIONS, COMPLETIONS
from harnessrl.proxy.surfaces.responses.stored import StoredCalls
from harnessrl.proxy.surfaces.responses.websocket import ResponsesSocket
from harnessrl.proxy.surfaces.responses.wire import RESPONSES
from harnessrl.proxy.weights_api import add_weights_api
from harnessrl.sampling_policy import load_policy

log = logging.getLogger("harnessrl.proxy")

# the API surfaces served on the hot path
ADAPTERS: tuple[Adapter, ...] = (CHAT_COMPLETIONS, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES, GEMINI)


def create_app(cfg: ProxyConfig, backend: TokenBackend | None = None,
               adapters: tuple[Adapter, ...] = ADAPTERS) -> ProxyApp:
    """The ASGI app for `cfg`; `backend` is the loaded local backend (backend="local"),
    `adapters` the API surfaces it serves at /v1/{adapter.path}."""
    cfg.check()
    if cfg.strict_tools:
        adapters = tuple(strict(a) for a in adapters)
    engine, session_factory = open_db(cfg.db, lock_timeout_s=cfg.db_lock_timeout_s,
                                      statement_timeout_s=cfg.db_statement_timeout_s)
    store = Rollouts(session_factory)
    stored = StoredCalls(session_factory)
    statuses = RolloutStatus(store, cfg.strict_rollouts)
    metrics = ProxyMetrics(engine)
    policy = load_policy(cfg.sampling_policy) if cfg.sampling_policy else None
    running = Lifespan(cfg, backend, engine, metrics, statuses)
    models = ModelEndpoints(cfg, running, statuses, stored, policy, backend)

    app = FastAPI(title="harnessrl proxy", lifespan=running, openapi_url=None, docs_url=None, redoc_url=None)
    add_error_handlers(app)
    for prefix in ("", "/r/{rollout}/a/{agent}"):
        app.add_route(prefix + "/v1/models", models.models, methods=["GET"])
    add_probes(app, engine, running, backend)
    add_metrics(app, cfg.api_key, metrics)
    add_surface_routes(app, cfg.api_key, lambda: running.serving.route, stored)
    add_rollout_api(app, cfg, store, statuses, running)
    add_weights_api(app, cfg, backend, store, running)

    responses = next((a for a in adapters if a.path == "responses"), None)
    ws = ResponsesSocket(models.serve, responses, cfg.api_key, stored.scoped,
                         lambda: running.serving.route.model_name) if responses is not None else None
    # Gemini's paths name the model and the method (`surfaces.gemini.endpoints`), not /v1/{path}
    gemini = next((a for a in adapters if a.surface == "gemini"), None)
    gemini_paths = GeminiEndpoints(models.serve, gemini, cfg.api_key, cfg.max_body_bytes,
                                   lambda: running.serving.route) if gemini is not None else None
    return ProxyApp(app, models.serve, tuple(a for a in adapters if a is not gemini),
                    Guard(app, cfg.api_key, cfg.max_body_bytes), ws, gemini_paths)


class ProxyApp:
    """The ASGI app: POSTs to an adapter's path go straight to the hot-path handler (skipping
    FastAPI's middleware and routing layers), a WebSocket to /v1/responses to
    `surfaces.responses.websocket` (which serves each call through the same handler); everything
    else, lifespan included, to FastAPI."""

    def __init__(self, api: FastAPI, hot, adapters: tuple[Adapter, ...], guard: Guard,
                 ws: ResponsesSocket | None = None, gemini: GeminiEndpoints | None = None) -> None:
        self.api = api
        self._gemini = gemini  # the Gemini API's paths (`surfaces.gemini.endpoints`)
        self._ws = ws  # the Responses WebSocket transport (`surfaces.responses.websocket`)
        self._guard = guard  # `api` behind the key and body-size checks
        self._hot = hot
        self._adapters = {a.path: a for a in adapters}
        # Anthropic's `messages` also without /v1: the Vercel AI SDK appends only `/messages` to
        # ANTHROPIC_BASE_URL, which `harnessrl run` sets without /v1 (as the official SDK wants it)
        self._hot_path = re.compile(r"^(?:/r/(?P<rollout>[^/]+)/a/(?P<agent>[^/]+))?(?P<v1>/v1)?/(?P<kind>"
                                    + "|".join(re.escape(p) for p in self._adapters) + ")/?$")
        self._bare = {"messages"}  # the adapters served without /v1 too

    def mount(self, path: str, sub) -> None:
        """Serve the ASGI app `sub` at `path` (the trace viewer at /ui). A sub-app that checks the
        proxy's key itself (`sub.state.checks_key`: the viewer's sign-in page, which a browser
        reaches without an Authorization header) is left to do so; any other stays behind the key."""
        self.api.mount(path, sub)
        if getattr(getattr(sub, "state", None), "checks_key", False):
            self._guard.own_key_check += (path.rstrip("/"),)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "lifespan" and scope["path"].startswith("/k/"):
            scope = key_in_path(scope)  # a rollout's base URL, its key inside (`identity.rollout_base_path`)
        if scope["type"] == "http" and scope["method"] == "POST":
            m = self._hot_path.match(scope["path"])
            if m is not None and (m["v1"] or m["kind"] in self._bare):
                params = {"rollout": m["rollout"], "agent": m["agent"]} if m["rollout"] else {}
                adapter = self._adapters[m["kind"]]
                try:
                    await self._hot(scope, receive, send, adapter, params)
                except Exception as exc:  # noqa: BLE001 - never a traceback to the harness
                    log.error("internal error on POST %s", scope["path"], exc_info=exc)
                    err = ProxyError(500, f"internal proxy error ({type(exc).__name__}); see the proxy's log",
                                     "server_error")
                    try:
                        await adapter.error(err)(scope, receive, send)
                    except Exception:  # noqa: BLE001 - the response had already started
                        pass
                return
        if scope["type"] == "websocket" and self._ws is not None:
            m = self._hot_path.match(scope["path"])
            if m is not None and m["v1"] and m["kind"] == "responses":
                await self._ws(scope, receive, send, {"rollout": m["rollout"], "agent": m["agent"]} if m["rollout"]
                               else {})
                return
        if self._gemini is not None and scope["type"] == "http":
            g = self._gemini.match(scope)
            if g is not None:
                await self._gemini(scope, receive, send, g)
                return
        await self._guard(scope, receive, send)
