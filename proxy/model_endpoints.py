"""The model endpoints: the hot path of every model call (`/v1/{surface}`, also under
`/r/{rollout}/a/{agent}`), and `GET /v1/models`.

`ModelEndpoints.serve` is what `app.ProxyApp` calls for a POST to an adapter's path, bypassing
FastAPI's middleware, routing and pydantic: it checks the key and the caller's identity, refuses
a finished rollout before reading the body, lets the adapter translate the body, applies the
sampling policy, takes the session's upstream lease, and hands the call to `Serving`. A call
refused on the way is recorded by `refusals.refuse` and answered in its surface's error shape.
"""

from __future__ import annotations

import time

import orjson
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from harnessrl.proxy.config import ProxyConfig
from harnessrl.proxy.errors import ProxyError, error_response
from harnessrl.proxy.identity import Identity, check_auth, check_scope, identify, reader_scope
from harnessrl.proxy.lifespan import Lifespan
from harnessrl.proxy.limits import read_body
from harnessrl.proxy.logs import call_id as current_call
from harnessrl.proxy.protocol import Request
from harnessrl.proxy.record.call_rows import new_call_id
from harnessrl.proxy.refusals import internal_error, refuse, user_agent
from harnessrl.proxy.rollouts.status import RolloutStatus
from harnessrl.proxy.routes.token_backend import TokenBackend
from harnessrl.proxy.sampling import enforce
from harnessrl.proxy.surfaces.adapter import Adapter
from harnessrl.proxy.surfaces.responses.stored import StoredCalls
from harnessrl.proxy.upstream.http_pool import Pool, UpstreamConnectionError
from harnessrl.proxy.validate import parse_json
from harnessrl.sampling_policy import SamplingPolicy

# the only request headers the hot path reads (decoding the rest would cost every call)
_HOT_HEADERS = {b"authorization", b"x-api-key", b"content-length", b"x-harnessrl-rollout", b"x-harnessrl-agent",
                b"x-harnessrl-session", b"x-harnessrl-parent-call", b"anthropic-version", b"anthropic-beta",
                b"user-agent"}


class ModelEndpoints:
    """The model endpoints of one app; `running` is its lifespan (`Serving`, the upstreams)."""

    def __init__(self, cfg: ProxyConfig, running: Lifespan, statuses: RolloutStatus, stored: StoredCalls,
                 policy: SamplingPolicy | None, backend: TokenBackend | None) -> None:
        self.cfg, self.running, self.statuses, self.stored = cfg, running, statuses, stored
        self.policy, self.backend = policy, backend

    async def serve(self, scope, receive, send, adapter: Adapter, path_params: dict) -> None:
        """One model call, from the ASGI scope to the response sent."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _HOT_HEADERS}
        lease = ident = body = None
        admitted, t0 = False, time.perf_counter()
        serving = self.running.serving
        try:
            granted = check_auth(headers, self.cfg.api_key)
            ident = identify(path_params, headers, self.cfg.api_key)
            check_scope(granted, ident.rollout)  # a rollout's key: its own rollout's calls only
            await self.statuses.check(ident.rollout)  # first: a finished rollout's call costs no body read
            admitted = True  # from here on a refusal is recorded in the rollout (`refusals`)
            body = parse_json(await read_body(headers, receive, self.cfg.max_body_bytes))
            call = await self._request(adapter, body, headers, ident)
            ups = self.running.upstreams
            if ups is not None:  # the session's upstream, held until the answer is sent
                lease = await ups.acquire((ident.rollout, ident.agent, ident.session))
                call.upstream = lease
                call.notes = {**(call.notes or {}), "harnessrl_upstream": lease.url}
            call_id = new_call_id()
            current_call.set(call_id)  # on every log line about this call (this request's task)
            wire = adapter.wire(call, call_id, serving.route.model_name)
            response = await serving.handle(call, ident, call_id, wire, adapter.error)
        except Exception as exc:  # noqa: BLE001 - `handle` answers its own failures; these are refusals
            err = exc if isinstance(exc, ProxyError) else internal_error(exc, scope["path"])
            response = await refuse(serving, adapter, err, ident, admitted, body, user_agent(headers), t0)
        try:
            await response(scope, receive, send)
        finally:
            if lease is not None:
                lease.release()

    async def _request(self, adapter: Adapter, body, headers: dict[str, str], ident: Identity) -> Request:
        """The adapter's internal `Request` for `body`, with what the records keep beside it."""
        call = adapter.request(body)
        if call.surface is not None and adapter.headers:
            call.surface["headers"] = {h: headers[h] for h in adapter.headers if h in headers}
        if self.policy is not None:
            enforce(self.policy, call)
        if adapter.resolve is not None:
            call = await adapter.resolve(call, self.stored.scoped(reader_scope(ident, headers, self.cfg.api_key)))
        call.via, call.client = adapter.surface, user_agent(headers)
        return call

    async def models(self, request: HTTPRequest) -> Response:
        """`GET /v1/models`: the upstream's own list when it is vLLM and no name is imposed; else
        the one served name."""
        cfg, backend = self.cfg, self.backend
        try:
            check_auth(request.headers, cfg.api_key)
        except ProxyError as err:
            return error_response(err)
        ups = self.running.upstreams
        pool: Pool | None = ups.home(("models",)).pool if ups is not None else self.running.pool
        if backend is None and pool is not None and not cfg.served_model_name and cfg.upstream_dialect == "openai-chat":
            try:
                resp = await pool.request("GET", "/v1/models")
            except (UpstreamConnectionError, TimeoutError) as exc:
                return error_response(ProxyError(502, str(exc), "upstream_error", code="upstream_unreachable"))
            return Response(resp.body, resp.status, media_type="application/json")
        name = backend.model_name if backend is not None else cfg.served_model_name
        return Response(orjson.dumps({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                                                 "owned_by": "harnessrl"}]}),
                        200, media_type="application/json")
