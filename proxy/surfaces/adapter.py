"""What an API surface gives the proxy: an `Adapter` (its path, its request translation, its wire)
and, for each call, a `Wire` that renders results and stream deltas in that API's format.
`app.ADAPTERS` lists the surfaces served; `Serving` answers through their wires."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from starlette.responses import Response

from harnessrl.proxy.errors import ProxyError, error_response
from harnessrl.proxy.protocol import Delta, Request, Result


class Wire(Protocol):
    """An adapter's output side for one call (see `surfaces.openai_chat`)."""

    def response(self, result: Result) -> dict: ...

    def chunks(self, deltas: list[Delta]) -> bytes: ...

    def close(self, result: Result) -> bytes: ...

    def error(self, err: ProxyError) -> bytes: ...


@dataclass(frozen=True)
class Adapter:
    """An API surface served at `/v1/{path}`: its request body → an internal `Request`
    (validated; a bad one raises a 400 `ProxyError`, recorded as a refused call by
    `refusals.refuse`), and the wire its answers go out in. Adapters translate; routes never see
    which API a call came in through (the records do: `surface`)."""

    path: str  # under /v1/, e.g. "chat/completions"
    request: Callable[[dict], Request]
    wire: Callable[[Request, str, str], Wire]  # (request, call id, served model name) -> Wire
    # how this surface answers an error, also one raised before its request is read (bad JSON, auth)
    error: Callable[..., Response] = error_response  # (error, headers=None)
    # a step that needs the records DB (Responses' previous_response_id): (request, fetch) ->
    # request, where `await fetch(call_id)` is a recorded call (`surfaces.responses.stored.load`) or None
    resolve: Callable[[Request, Callable[[str], Awaitable[dict | None]]], Awaitable[Request]] | None = None
    headers: tuple[str, ...] = ()  # request headers recorded with the call (in `Request.surface`)
    surface: str = ""  # recorded as `calls.surface`; "": the path's first segment (chat, responses, ...)

    def __post_init__(self) -> None:
        if not self.surface:
            object.__setattr__(self, "surface", self.path.partition("/")[0])

    @property
    def endpoint(self) -> str:
        """The compiler's meaning of the call (`calls.endpoint`): every chat-shaped surface is "chat"."""
        return self.surface if self.surface in ("completions", "embeddings") else "chat"
