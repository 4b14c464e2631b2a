"""The Responses API's WebSocket transport, as Codex uses it: `GET /v1/responses` (also under
/r/{rollout}/a/{agent}) upgraded to a WebSocket, then one JSON text message
`{"type": "response.create", ...Responses body...}` per turn, answered with the same events the
SSE stream carries, one per text message; one response at a time on a connection.

Each `response.create` is served by the proxy's one HTTP hot path (`hot`: auth, identity, the
RESPONSES adapter, `Serving.handle`, the records) through an in-process request, so a call over the
socket is checked, served and recorded exactly as a POST is — with surface `responses-ws`.
`stream` is implied. Auth and identity are checked at the handshake (a refusal is the HTTP
answer a POST would get) and again on every call.

What the transport adds:
- `previous_response_id` of the connection's last response works with `store: false` (the API
  keeps that response in the connection's memory; the proxy reads the call back from the records);
  any other id must be a stored response, as over HTTP;
- `generate: false` (a warm-up): the request is checked and translated, nothing is generated or
  recorded; the answer is `response.created` + `response.completed` with no output, and its id
  can be extended by the next call like any response's;
- an error before the stream starts is an `error` event carrying the HTTP status
  (`{"type": "error", "status": 400, "error": {...}}`); the connection stays open.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import orjson
from starlette.requests import ClientDisconnect

from harnessrl.proxy.record.call_rows import new_call_id
from harnessrl.proxy.errors import ProxyError, bad_request, error_body
from harnessrl.proxy.identity import check_auth, check_scope, identify, reader_scope
from harnessrl.proxy.protocol import Request
from harnessrl.proxy.surfaces.responses.request import CONTEXT_NOTE, LOADED_NOTE, resolve
from harnessrl.proxy.surfaces.responses.wire import ResponsesWire
from harnessrl.proxy.surfaces.adapter import Adapter
from harnessrl.proxy.validate import parse_json

SURFACE = "responses-ws"
log = logging.getLogger("harnessrl.proxy")
Fetch = Callable[[str], Awaitable[dict | None]]


class _Connection:
    """One socket's state: its last response (for `previous_response_id` with `store: false`)."""

    def __init__(self, adapter: Adapter, fetch: Fetch) -> None:
        self.fetch = fetch
        self.last_id: str | None = None  # the call id of the last response
        self.warmup: dict | None = None  # the last response, when it was a warm-up (never recorded)
        self.adapter = replace(adapter, surface=SURFACE, resolve=self.resolve)

    async def local(self, call_id: str) -> dict | None:
        if call_id != self.last_id:
            return await self.fetch(call_id)
        if self.warmup is not None:
            return self.warmup
        got = await self.fetch(call_id)
        # the connection's last response extends whatever its `store` said
        return {**got, "store": True} if got is not None else None

    async def resolve(self, req: Request, _fetch: Fetch) -> Request:
        # (`Adapter.resolve`'s signature: the records' fetch it is handed is `self.fetch`, which
        # `local` falls back to)
        return await resolve(req, self.local)


class ResponsesSocket:
    """Serves the WebSocket scopes of the Responses path. `hot(scope, receive, send, adapter,
    path_params)` is the app's HTTP hot path; `scoped(rollout)` reads a recorded call of that
    rollout (`StoredCalls.scoped`: the socket's identity decides, as for a POST)."""

    def __init__(self, hot, adapter: Adapter, api_key: str | None, scoped: Callable[[str | None], Fetch],
                 model: Callable[[], str]) -> None:
        self.hot = hot
        self.adapter = adapter
        self.api_key = api_key
        self.scoped = scoped
        self.model = model  # the served model's name (known once the app has started)

    async def __call__(self, scope, receive, send, path_params: dict) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            granted = check_auth(headers, self.api_key)
            ident = identify(path_params, headers, self.api_key)
            check_scope(granted, ident.rollout)
        except ProxyError as err:
            await _deny(scope, send, err)
            return
        await send({"type": "websocket.accept"})
        conn = _Connection(self.adapter, self.scoped(reader_scope(ident, headers, self.api_key)))
        while True:
            msg = await receive()
            if msg["type"] == "websocket.disconnect":
                return
            text = msg.get("text") if msg.get("text") is not None else (msg.get("bytes") or b"").decode("utf-8",
                                                                                                      "replace")
            try:
                await self._turn(conn, scope, send, path_params, text)
            except (OSError, ClientDisconnect):  # gone mid-answer: the call is recorded cancelled
                return
            except Exception as exc:  # noqa: BLE001 - never a traceback to the harness, nor a dead socket
                log.error("internal error on the Responses WebSocket %s", scope["path"], exc_info=exc)
                await _error_event(send, ProxyError(500, f"internal proxy error ({type(exc).__name__}); see the "
                                                         "proxy's log", "server_error"))

    async def _turn(self, conn: _Connection, scope, send, path_params: dict, text: str) -> None:
        try:
            event = parse_json(text.encode())  # (an object, nested no deeper than a body may be)
        except ProxyError as err:
            return await _error_event(send, err)
        if event.get("type") != "response.create":
            return await _error_event(send, bad_request("type: the only client event served is 'response.create'",
                                                        param="type", code="unsupported_event"))
        body = {k: v for k, v in event.items() if k not in ("type", "generate")}
        if event.get("generate") is False:
            return await self._warmup(conn, send, body)
        if event.get("generate") not in (None, True):
            return await _error_event(send, bad_request("generate: must be a boolean", param="generate"))
        body["stream"] = True
        raw = orjson.dumps(body)
        relay = _Relay(send)
        await self.hot(_http_scope(scope, len(raw)), _receive(raw), relay.send, conn.adapter, path_params)
        if relay.call_id is not None and relay.ended:
            conn.last_id, conn.warmup = relay.call_id, None

    async def _warmup(self, conn: _Connection, send, body: dict) -> None:
        try:
            req = await conn.resolve(conn.adapter.request({**body, "stream": True}), conn.fetch)
        except ProxyError as err:
            return await _error_event(send, err)
        call_id = new_call_id()
        wire = ResponsesWire(req, call_id, self.model())
        for frame in _frames(wire.warmup().split(b"\n\n")):
            await send({"type": "websocket.send", "text": frame})
        conn.last_id = call_id
        conn.warmup = {"api": "responses", "store": True, "ok": True, "messages": req.body["messages"],
                       "reply": None, "context_tools": (req.notes or {}).get(CONTEXT_NOTE),
                       "loaded_tools": (req.notes or {}).get(LOADED_NOTE)}


class _Relay:
    """The `send` of the in-process HTTP call: its SSE events out as WebSocket text messages, an
    error answer as one `error` event."""

    def __init__(self, send) -> None:
        self.ws_send = send
        self.status = 200
        self.call_id: str | None = None
        self.ended = False  # the stream ended with a complete or incomplete response
        self.buf = b""

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            for k, v in message.get("headers") or ():
                if k.lower() == b"x-harnessrl-call":
                    self.call_id = v.decode("latin-1")
            return
        if message["type"] != "http.response.body":
            return
        self.buf += message.get("body", b"")
        if self.status != 200:
            if not message.get("more_body"):
                await self._error(self.buf)
            return
        *done, self.buf = self.buf.split(b"\n\n")
        for frame in _frames(done):
            # the wire writes "type" first (`ResponsesWire._event`)
            self.ended = self.ended or frame.startswith(('{"type":"response.completed"',
                                                        '{"type":"response.incomplete"'))
            await self.ws_send({"type": "websocket.send", "text": frame})

    async def _error(self, body: bytes) -> None:
        try:
            err = orjson.loads(body).get("error") or {}
        except (orjson.JSONDecodeError, AttributeError):
            err = {"type": "server_error", "message": body.decode("utf-8", "replace")}
        await self.ws_send({"type": "websocket.send", "text": orjson.dumps(
            {"type": "error", "status": self.status, "error": err}).decode()})


def _frames(events: list[bytes]) -> list[str]:
    """The data of each whole SSE event."""
    out = []
    for event in events:
        for line in event.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(line[6:].decode())
    return out


async def _error_event(send, err: ProxyError) -> None:
    error = orjson.loads(error_body(err.message, err.type, err.param, err.code))["error"]
    await send({"type": "websocket.send", "text": orjson.dumps(
        {"type": "error", "status": err.status, "error": error}).decode()})


async def _deny(scope, send, err: ProxyError) -> None:
    """The handshake refused with the HTTP answer a POST would get (or a bare close where the
    server cannot send one)."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await send({"type": "websocket.http.response.start", "status": err.status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "websocket.http.response.body",
                    "body": error_body(err.message, err.type, err.param, err.code)})
    else:
        await send({"type": "websocket.close", "code": 1008})


def _http_scope(ws_scope, size: int) -> dict:
    headers = [(k, v) for k, v in ws_scope["headers"] if k != b"content-length"]
    return {**ws_scope, "type": "http", "method": "POST", "http_version": "1.1", "scheme": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},  # send raises OSError once the client is gone
            "headers": headers + [(b"content-length", str(size).encode())]}


def _receive(body: bytes):
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:  # not asked for at spec version 2.4; never a disconnect the call did not see
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive

