"""The FastAPI side's exception handlers: whatever goes wrong on the rollout API, the weights
endpoint or any other FastAPI route is answered with an OpenAI-shaped error (the hot path
answers its own, in its surface's shape: `model_endpoints`)."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from harnessrl.proxy.errors import ProxyError, database_unavailable, error_body, error_response

log = logging.getLogger("harnessrl.proxy")


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ProxyError, _proxy_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(DBAPIError, _db_down)
    app.add_exception_handler(Exception, _crash)


async def _proxy_error(_req, exc: ProxyError) -> Response:
    return error_response(exc)


async def _invalid(_req, exc: RequestValidationError) -> Response:
    """A body that fails its pydantic model (`rollouts.bodies`): a 400 naming the field."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
    msg = first.get("msg", "invalid request")
    code = "invalid_json" if first.get("type") == "json_invalid" else "invalid_type"
    return Response(error_body(f"{loc + ': ' if loc else ''}{msg}", "invalid_request_error", loc, code), 400,
                    media_type="application/json")


async def _http(_req, exc: StarletteHTTPException) -> Response:
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    return Response(error_body(str(exc.detail), kind, None, None), exc.status_code, media_type="application/json")


async def _db_down(req, exc: DBAPIError) -> Response:
    # a lost or refused connection on the rollout API: retryable, and the text stays in the log
    log.warning("records DB error on %s %s: %s", req.method, req.url.path, exc)
    return error_response(database_unavailable())


async def _crash(req, exc: Exception) -> Response:
    # the text may hold SQL or paths: it goes to the log, never into a response
    log.error("internal error on %s %s", req.method, req.url.path, exc_info=exc)
    return Response(error_body(f"internal proxy error ({type(exc).__name__}); see the proxy's log",
                               "server_error"), 500, media_type="application/json")
