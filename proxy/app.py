"""The proxy's ASGI app: the model endpoints (also under /r/{rollout}/a/{agent}/v1), the
rollout API and the weights endpoint.

The model endpoints are the hot path: `ProxyApp` matches their path to an API adapter
(`ADAPTERS`) and hands the call to `Serving` with the app's one route (`_route`) — no FastAPI
middleware, routing or pydantic model; adapters check bodies by hand so any malformed request
gets an OpenAI error. Everything else goes through FastAPI.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import time
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from harnessrl.db import open_db
from harnessrl.sampling_policy import load_policy
from harnessrl.proxy.surfaces.anthropic.wire import MESSAGES
from harnessrl.proxy.rollouts.bodies import CreateRollout, FinishIn, RewardIn, WeightsIn
from harnessrl.proxy.routes.token_backend import TokenBackend
from harnessrl.proxy.record.call_rows import new_call_id
from harnessrl.proxy.config import ProxyConfig
from harnessrl.proxy.surfaces.embeddings import EMBEDDINGS
from harnessrl.proxy.errors import ProxyError, bad_request, database_unavailable, error_body, error_response
from harnessrl.proxy.upstream.http_pool import Pool, UpstreamConnectionError, credential_headers
from harnessrl.proxy.identity import check_auth, check_id, check_labels, identify, reader_scope
from harnessrl.proxy.limits import Guard, check_metadata, read_body
from harnessrl.proxy.logs import call_id as current_call
from harnessrl.proxy.prometheus import ProxyMetrics
from harnessrl.proxy.surfaces.openai_chat import CHAT_COMPLETIONS, COMPLETIONS
from harnessrl.proxy.prefix.prompts import Prompter
from harnessrl.proxy.probes import add_probes
from harnessrl.proxy.protocol import Route
from harnessrl.proxy.record.recorder import Recorder
from harnessrl.proxy.record.failed_call_journal import default_dir
from harnessrl.proxy.refusals import internal_error, refuse, user_agent
from harnessrl.proxy.surfaces.responses.wire import RESPONSES
from harnessrl.proxy.surfaces.responses.websocket import ResponsesSocket
from harnessrl.proxy.rollouts.store import Rollouts, rollout_json
from harnessrl.proxy.sampling import enforce
from harnessrl.proxy.rollouts.status import RolloutStatus
from harnessrl.proxy.routes.passthrough import PassThroughRoute
from harnessrl.proxy.routes.tokens import TokenRoute
from harnessrl.proxy.serving import Adapter, Serving
from harnessrl.proxy.surfaces.responses.stored import StoredCalls
from harnessrl.proxy.surfaces.non_model_routes import add_surface_routes
from harnessrl.proxy.surfaces.hosted_tools import strict
from harnessrl.proxy.routes.text import TextOnlyRoute
from harnessrl.proxy.upstream.anthropic import ANTHROPIC_DIALECT
from harnessrl.proxy.upstream.openai_responses import RESPONSES_DIALECT
from harnessrl.proxy.upstream.vllm_tokens import UpstreamTokens
from harnessrl.proxy.upstream.ring_life import start_upstreams, stop_upstreams
from harnessrl.proxy.prefix.volatile import Volatile
from harnessrl.proxy.upstream.weight_push import push_all
from harnessrl.proxy.validate import parse_json

GC_GEN0 = 20_000
log = logging.getLogger("harnessrl.proxy")


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status, media_type="application/json")


# the API surfaces served on the hot path
ADAPTERS: tuple[Adapter, ...] = (CHAT_COMPLETIONS, COMPLETIONS, EMBEDDINGS, RESPONSES, MESSAGES)
_HOT_HEADERS = {b"authorization", b"x-api-key", b"content-length", b"x-harnessrl-rollout", b"x-harnessrl-agent",
                b"x-harnessrl-session", b"x-harnessrl-parent-call", b"anthropic-version", b"anthropic-beta",
                b"user-agent"}


def _route(cfg: ProxyConfig, backend: TokenBackend | None, pool: Pool | None) -> Route:
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
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        recorder = Recorder(engine, busy_s=cfg.db_lock_timeout_s, metrics=metrics,
                            spill_dir=default_dir(engine.url, cfg.spill_dir), spill_max_bytes=cfg.spill_max_bytes)
        def make_pool(url: str) -> Pool:
            return Pool(url, timeout=cfg.upstream_timeout, ca_file=cfg.upstream_ca,
                        credentials=credential_headers(cfg.upstream_dialect, cfg.upstream_api_key))

        ups = start_upstreams(cfg, make_pool, metrics.registry) if cfg.several else None
        pool = ups.all[0].pool if ups is not None else make_pool(cfg.upstream) if cfg.upstream else None
        serving = Serving(_route(cfg, backend, pool), recorder, statuses, cfg.prefix_cache_bytes, metrics,
                          Volatile(cfg.volatile_patterns), hold=cfg.prefix_mode)
        metrics.watch(lambda: recorder.queue_depth, lambda: serving.index.nbytes)
        state.update(serving=serving, recorder=recorder, pool=pool, upstreams=ups)
        # What exists now (modules, the app, the tokenizer) lives as long as the process: frozen,
        # the garbage collector stops walking it on every collection that the hot path's
        # short-lived JSON objects set off (~8% of the hot path's CPU in a profile)
        gc.freeze()
        # Under load the calls in flight hold thousands of young containers (parsed bodies, one
        # dict per log-prob), so at the default gen-0 threshold (700) a collection ran every ~18
        # calls and walked them all: ~15 µs a call at 64 clients. At 20,000 one runs only when
        # objects really accumulate (the prefix index grows slowly); older generations as before.
        gc.set_threshold(GC_GEN0, *gc.get_threshold()[1:])
        try:
            yield
        finally:
            if ups is not None:
                stop_upstreams(ups)
            elif pool is not None:
                pool.close()
            recorder.close()
            engine.dispose()

    app = FastAPI(title="harnessrl proxy", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)

    # ---- errors: always OpenAI-shaped --------------------------------------------------
    @app.exception_handler(ProxyError)
    async def _proxy_error(_req, exc: ProxyError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        msg = first.get("msg", "invalid request")
        code = "invalid_json" if first.get("type") == "json_invalid" else "invalid_type"
        return Response(error_body(f"{loc + ': ' if loc else ''}{msg}", "invalid_request_error", loc, code), 400,
                        media_type="application/json")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req, exc: StarletteHTTPException):
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return Response(error_body(str(exc.detail), kind, None, None), exc.status_code, media_type="application/json")

    @app.exception_handler(DBAPIError)
    async def _db_down(req, exc: DBAPIError):
        # a lost or refused connection on the rollout API: retryable, and the text stays in the log
        log.warning("records DB error on %s %s: %s", req.method, req.url.path, exc)
        return error_response(database_unavailable())

    @app.exception_handler(Exception)
    async def _crash(req, exc: Exception):
        # the text may hold SQL or paths: it goes to the log, never into a response
        log.error("internal error on %s %s", req.method, req.url.path, exc_info=exc)
        return Response(error_body(f"internal proxy error ({type(exc).__name__}); see the proxy's log",
                                   "server_error"), 500, media_type="application/json")

    # ---- OpenAI endpoints (hot path) ----------------------------------------------------
    async def hot(scope, receive, send, adapter: Adapter, path_params: dict) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _HOT_HEADERS}
        lease = ident = body = None
        admitted, t0 = False, time.perf_counter()
        try:
            check_auth(headers, cfg.api_key)
            ident = identify(path_params, headers, cfg.api_key)
            await statuses.check(ident.rollout)  # first: a finished rollout's call costs no body read
            admitted = True  # from here on a refusal is recorded in the rollout (`refusals`)
            body = parse_json(await read_body(headers, receive, cfg.max_body_bytes))
            call = adapter.request(body)
            if call.surface is not None and adapter.headers:
                call.surface["headers"] = {h: headers[h] for h in adapter.headers if h in headers}
            if policy is not None:
                enforce(policy, call)
            if adapter.resolve is not None:
                call = await adapter.resolve(call, stored.scoped(reader_scope(ident, headers, cfg.api_key)))
            call.via, call.client = adapter.surface, user_agent(headers)
            serving: Serving = state["serving"]
            if state["upstreams"] is not None:  # the session's upstream, held until the answer is sent
                lease = await state["upstreams"].acquire((ident.rollout, ident.agent, ident.session))
                call.upstream = lease
                call.notes = {**(call.notes or {}), "harnessrl_upstream": lease.url}
            call_id = new_call_id()
            current_call.set(call_id)  # on every log line about this call (this request's task)
            wire = adapter.wire(call, call_id, serving.route.model_name)
            response = await serving.handle(call, ident, call_id, wire, adapter.error)
        except Exception as exc:  # noqa: BLE001 - `handle` answers its own failures; these are refusals
            err = exc if isinstance(exc, ProxyError) else internal_error(exc, scope["path"])
            response = await refuse(state["serving"], adapter, err, ident, admitted, body, user_agent(headers), t0)
        try:
            await response(scope, receive, send)
        finally:
            if lease is not None:
                lease.release()

    async def models(request: Request) -> Response:
        try:
            check_auth(request.headers, cfg.api_key)
        except ProxyError as err:
            return error_response(err)
        ups = state["upstreams"]
        pool: Pool | None = ups.home(("models",)).pool if ups is not None else state["pool"]
        if backend is None and pool is not None and not cfg.served_model_name and cfg.upstream_dialect == "openai-chat":
            try:
                resp = await pool.request("GET", "/v1/models")
            except (UpstreamConnectionError, TimeoutError) as exc:
                return error_response(ProxyError(502, str(exc), "upstream_error", code="upstream_unreachable"))
            return Response(resp.body, resp.status, media_type="application/json")
        name = backend.model_name if backend is not None else cfg.served_model_name
        return _json({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                  "owned_by": "harnessrl"}]})

    for prefix in ("", "/r/{rollout}/a/{agent}"):
        app.add_route(prefix + "/v1/models", models, methods=["GET"])
    add_probes(app, engine, state, backend)
    add_surface_routes(app, cfg.api_key, lambda: state["serving"].route, stored)

    @app.get("/metrics")
    def prometheus(request: Request) -> Response:
        try:
            check_auth(request.headers, cfg.api_key)
        except ProxyError as err:
            return error_response(err)
        body, content_type = metrics.render()
        return Response(body, 200, media_type=content_type)

    # ---- rollout API -------------------------------------------------------------------
    def auth(request: Request) -> None:
        check_auth(request.headers, cfg.api_key)

    api = Depends(auth)

    def _reward_ok(body: RewardIn, **ident: str) -> None:
        for kind, value in ident.items():
            check_id(kind, value)
        check_labels(name=body.name)
        check_metadata(body.metadata, cfg.max_metadata_bytes)

    @app.post("/harnessrl/rollouts", dependencies=[api])
    async def create_rollout(body: CreateRollout, request: Request):
        if body.id is not None:
            check_id("rollout", body.id, "id")
        check_labels(task_id=body.task_id, group_id=body.group_id, run=body.run)
        check_metadata(body.metadata, cfg.max_metadata_bytes)
        r = await run_in_threadpool(store.create, body.task_id, body.group_id, body.run, body.metadata, body.id)
        statuses.set(r.id, r.status)  # on the event loop thread, like every use of the cache
        base = str(request.base_url).rstrip("/")
        return _json({**rollout_json(r), "base_url_template": f"{base}/r/{r.id}/a/{{agent}}/v1"})

    @app.post("/harnessrl/rollouts/{rollout_id}/reward", dependencies=[api])
    def outcome_reward(rollout_id: str, body: RewardIn):
        _reward_ok(body, rollout=rollout_id)
        rid = store.outcome(rollout_id, body.value, body.name or "outcome", body.metadata)
        return _json({"id": rid, "rollout_id": rollout_id, "kind": "outcome", "value": body.value})

    @app.post("/harnessrl/calls/{call_id}/reward", dependencies=[api])
    def process_reward(call_id: str, body: RewardIn):
        _reward_ok(body, call=call_id)
        rid = store.process(call_id, body.value, body.name or "process", body.metadata)
        return _json({"id": rid, "call_id": call_id, "kind": "process", "value": body.value})

    @app.post("/harnessrl/rollouts/{rollout_id}/finish", dependencies=[api])
    async def finish_rollout(rollout_id: str, body: FinishIn | None = None):
        check_id("rollout", rollout_id)
        r = await run_in_threadpool(store.finish, rollout_id, body.error if body else None)
        statuses.set(r.id, r.status)
        state["serving"].index.forget(r.id)  # here, on the event loop thread that owns the index
        return _json(rollout_json(r))

    @app.get("/harnessrl/rollouts", dependencies=[api])
    def list_rollouts(task_id: str | None = None, group_id: str | None = None, run: str | None = None):
        check_labels(task_id=task_id, group_id=group_id, run=run)
        return _json({"object": "list", "data": store.list(task_id, group_id, run)})

    @app.get("/harnessrl/rollouts/{rollout_id}", dependencies=[api])
    def get_rollout(rollout_id: str):
        check_id("rollout", rollout_id)
        return _json(store.get(rollout_id))

    @app.post("/harnessrl/weights", dependencies=[api])
    async def push_weights(body: WeightsIn):
        check_labels(version=body.version)
        if "\0" in body.path:
            raise bad_request("'path' may not hold U+0000", param="path", code="invalid_value")
        if state["upstreams"] is not None:
            version = body.version or os.path.basename(body.path.rstrip("/"))
            check_labels(version=version)
            report = await push_all(state["upstreams"], body.path, version, body.lora, cfg.push_mode,
                                    cfg.drain_timeout_s)
            await run_in_threadpool(store.weight_version, version, body.path)
            return _json(report)
        return await run_in_threadpool(_push_one_backend, body)

    def _push_one_backend(body: WeightsIn) -> Response:
        if backend is not None:
            try:
                version = backend.reload(body.path, body.version)
            except Exception as exc:  # noqa: BLE001 - a bad checkpoint is the caller's error
                raise ProxyError(400, f"cannot load weights from {body.path!r}: {exc}", param="path",
                                 code="bad_checkpoint") from None
        elif cfg.reload_hook is not None:
            version = cfg.reload_hook(body.path, body.version)
        else:
            raise ProxyError(400, "this proxy forwards to an upstream without a reload hook: push weights to the "
                                  "inference server itself", code="reload_unsupported")
        store.weight_version(version, body.path)
        return _json({"version": version})

    responses = next((a for a in adapters if a.path == "responses"), None)
    ws = ResponsesSocket(hot, responses, cfg.api_key, stored.scoped,
                         lambda: state["serving"].route.model_name) if responses is not None else None
    return ProxyApp(app, hot, adapters, Guard(app, cfg.api_key, cfg.max_body_bytes), ws)


class ProxyApp:
    """The ASGI app: POSTs to an adapter's path go straight to the hot-path handler (skipping
    FastAPI's middleware and routing layers), a WebSocket to /v1/responses to `surfaces.responses.websocket` (which
    serves each call through the same handler); everything else, lifespan included, to FastAPI."""

    def __init__(self, api: FastAPI, hot, adapters: tuple[Adapter, ...], guard: Guard,
                 ws: ResponsesSocket | None = None) -> None:
        self.api = api
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
        await self._guard(scope, receive, send)
