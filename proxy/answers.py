"""The two answers of the hot path, as ASGI apps: a 200 whose JSON is already encoded, and a 200
stream. Each sends the messages and headers Starlette's `Response` / `StreamingResponse` send,
without their per-call machinery (header lists built per answer; for a stream, an anyio task group
to watch for the hang-up, and a write of its own for the response's end: together ~15 % of a
streamed call's CPU, docs/benchmarks.md › Proxy overhead)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from starlette.requests import ClientDisconnect


class JSONAnswer:
    """A 200 answer whose JSON is already encoded."""

    __slots__ = ("body", "call_id")

    def __init__(self, body: bytes, call_id: str) -> None:
        self.body, self.call_id = body, call_id

    async def __call__(self, scope, receive, send) -> None:
        prefix = "websocket." if scope["type"] == "websocket" else ""
        await send({"type": prefix + "http.response.start", "status": 200, "headers": [
            (b"x-harnessrl-call", self.call_id.encode("latin-1")), (b"content-length", str(len(self.body)).encode()),
            (b"content-type", b"application/json")]})
        await send({"type": prefix + "http.response.body", "body": self.body})


class Last(bytes):
    """A stream's last chunk: sent with the response's end, in one write instead of two (a
    streamed call makes ~4 writes in all: its head, ~2 chunks, its end)."""


class StreamAnswer:
    """A 200 stream of `body`'s chunks. A harness that hangs up ends it: at ASGI spec 2.4 a send
    raises `OSError` then (Starlette's `ClientDisconnect` is raised, as `StreamingResponse` does);
    below (uvicorn's 2.3) a send to a closed connection does nothing, so one plain task waits for
    the `http.disconnect` and cancels the stream. The body generator is closed however the answer
    ends: its cleanup records the call (left suspended, it would wait for garbage collection)."""

    __slots__ = ("body", "headers", "ended")

    def __init__(self, body: AsyncGenerator[bytes, None], headers: dict[str, str],
                 media_type: str = "text/event-stream") -> None:
        self.body = body
        self.headers = [*((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
                        (b"content-type", _content_type(media_type))]
        self.ended = False  # the response's end is sent

    async def __call__(self, scope, receive, send) -> None:
        try:
            if _spec(scope) >= (2, 4):
                try:
                    await self._stream(send)
                except OSError:
                    raise ClientDisconnect() from None
            else:
                await self._watched(receive, send)
        finally:
            await self.body.aclose()

    async def _stream(self, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.headers})
        async for chunk in self.body:  # after a `Last`, on to the generator's end (its cleanup)
            self.ended = type(chunk) is Last
            await send({"type": "http.response.body", "body": chunk, "more_body": not self.ended})
        if not self.ended:
            self.ended = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watched(self, receive, send) -> None:
        me = asyncio.current_task()
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            if not self.ended:  # (uvicorn answers a receive with a disconnect once the response is complete)
                gone = True
                me.cancel()  # type: ignore[union-attr]

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await self._stream(send)
        except asyncio.CancelledError:
            if not gone:
                raise
            me.uncancel()  # type: ignore[union-attr]  # the hang-up's cancel, ours: the answer ends quietly
        finally:
            watcher.cancel()


def _content_type(media_type: str) -> bytes:
    """As Starlette writes it: a text type with its charset."""
    if media_type.startswith("text/") and "charset=" not in media_type.lower():
        media_type += "; charset=utf-8"
    return media_type.encode("latin-1")


def _spec(scope) -> tuple[int, ...]:
    return tuple(map(int, scope.get("asgi", {}).get("spec_version", "2.0").split(".")))
