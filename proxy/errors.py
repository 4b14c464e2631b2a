"""OpenAI-shaped HTTP errors: `{"error": {"message", "type", "param", "code"}}`, and the one
mapping from whatever a route raised to the error the harness gets (4xx: the harness's
request; 5xx: the proxy, its setup or the upstream)."""

from __future__ import annotations

import asyncio
import logging

import orjson
from starlette.responses import Response

from harnessrl.proxy.upstream.http_pool import UpstreamConnectionError

log = logging.getLogger("harnessrl.proxy")


class ProxyError(Exception):
    """An error the harness gets back as an OpenAI error body with this HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)


class BackendRejected(ProxyError):
    """A request the model backend cannot serve: the harness's mistake (4xx: prompt too long,
    messages the chat template rejects) or the server's setup (5xx: no chat template)."""

    def __init__(self, message: str, status: int = 400, code: str = "backend_rejected",
                 param: str | None = None) -> None:
        super().__init__(status, message, "invalid_request_error" if status < 500 else "server_error", param, code)


class UpstreamMalformed(ProxyError):
    """The upstream answered 200 with something that is not the wire format it promised."""

    def __init__(self, detail: object) -> None:
        super().__init__(502, f"malformed upstream response: {detail}", "upstream_error", code="upstream_malformed")


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def database_unavailable(message: str = "the records database is unavailable; retry shortly") -> ProxyError:
    return ProxyError(503, message, "server_error", code="database_unavailable")


def error_response(err: ProxyError, headers: dict[str, str] | None = None) -> Response:
    """The HTTP answer for `err`; a 503 (the records DB is away) says when to retry."""
    if err.status == 503:
        headers = {**(headers or {}), "retry-after": "1"}
    return Response(err.body(), err.status, headers, "application/json")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ProxyError:
    return ProxyError(400, message, "invalid_request_error", param, code)


def as_proxy_error(exc: BaseException, call_id: str | None = None) -> ProxyError:
    """The error the harness gets for whatever a route raised. An unexpected exception's text
    may hold paths, SQL or parameters: it goes to the log with the call id, never into the answer."""
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, asyncio.TimeoutError):
        return ProxyError(504, "the upstream did not answer in time", "upstream_timeout", code="timeout")
    if isinstance(exc, UpstreamConnectionError):
        return ProxyError(502, str(exc), "upstream_error", code="upstream_unreachable")
    log.error("call %s: model backend failed", call_id, exc_info=exc)
    return ProxyError(500, f"model backend failed ({type(exc).__name__}); the proxy log has the details for this call "
                           "id", "server_error", code="backend_error")
