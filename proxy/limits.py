"""Bounds on what a client can make the proxy hold: one body limit for every route, the API key
checked before a byte of a body is read, and a size limit on rollout and reward metadata.

The model endpoints read their body with `read_body` themselves (after the key and identity
checks); everything else passes through `Guard`, which does the same in front of FastAPI, so no
route — rollout, reward, weights, /v1/models, the viewer — parses a body it should have refused.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from harnessrl.proxy.errors import ProxyError, bad_request, error_response
from harnessrl.proxy.identity import check_auth

# probes carry no key (see probes.py)
OPEN_PATHS = frozenset({"/health", "/ready"})
# the key in either header `identity.check_auth` reads (x-api-key: Anthropic's SDK, and harnesses
# that set only that one); one header missing here once refused x-api-key on every route but the hot path
_GUARD_HEADERS = {b"authorization", b"x-api-key", b"content-length"}


def too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"request body is larger than the limit of {limit} bytes", code="body_too_large")


async def read_body(headers: dict[str, str], receive, limit: int) -> bytes:
    """The request body, refused (413) past `limit` bytes without reading the rest."""
    size = headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise too_large(limit)
    chunks, total = [], 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            raise ProxyError(400, "the client disconnected", code="client_disconnected")
        chunk = msg.get("body", b"")
        total += len(chunk)
        if total > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not msg.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class Guard:
    """ASGI wrapper: the key, then the body within `max_body` bytes, then `app` with that body."""

    def __init__(self, app, api_key: str | None, max_body: int) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body = max_body
        self.own_key_check: tuple[str, ...] = ()  # mounted apps that check the key themselves (`ProxyApp.mount`)

    def _checks_key(self, path: str) -> bool:
        return path not in OPEN_PATHS and not any(path == p or path.startswith(p + "/") for p in self.own_key_check)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _GUARD_HEADERS}
        try:
            if self._checks_key(scope["path"]):
                check_auth(headers, self.api_key)
            body = await read_body(headers, receive, self.max_body)
        except ProxyError as err:
            await error_response(err)(scope, receive, send)
            return
        started = False

        async def tracked(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, _replay(body, receive), tracked)
        except Exception:
            # The app's handler has logged it and sent its 500, and Starlette re-raised it: the
            # server would then drop the connection, and with it the client's next request on it
            if not started:
                raise


def _replay(body: bytes, receive):
    """A `receive` that gives the body already read, then whatever the client sends next (a
    disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return replay


def check_metadata(meta: dict | None, limit: int) -> None:
    """Rollout and reward `metadata`: plain JSON (what every database stores alike) that the
    proxy can write back (orjson: integers within 64 bits, nesting within 254 levels — stored
    beyond that, the rollout list could no longer be answered), of at most `limit` bytes."""
    if meta is None:
        return
    try:
        size = len(orjson.dumps(meta))
        json.dumps(meta, allow_nan=False)  # orjson would write NaN and Infinity as null
    except (orjson.JSONEncodeError, ValueError):  # (JSONEncodeError is a TypeError)
        raise bad_request("'metadata' must be plain JSON: no NaN or Infinity, no unpaired surrogates, integers "
                          "in [-2^63, 2^64-1], nested at most 254 levels", param="metadata",
                          code="invalid_value") from None
    if size > limit:
        raise bad_request(f"'metadata' is {size} bytes as JSON; the limit is {limit}", param="metadata",
                          code="metadata_too_large")
