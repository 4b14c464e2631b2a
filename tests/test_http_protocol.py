"""The proxy's HTTP protocol (`proxy/http_protocol.py`) on a real socket under uvicorn: a
non-streamed answer leaves in one socket write (uvicorn alone makes two), a stream's chunk
still leaves before the app produces the next one, and the bytes are exactly uvicorn's."""

from __future__ import annotations

import asyncio
import socket
import threading

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from asgi_thread import serve_in_thread
from harnessrl.proxy.http_protocol import CoalescingHttpTools

BODY = b'{"answer": "' + b"x" * 3000 + b'"}'
REQUEST = b"GET /%s HTTP/1.1\r\nhost: t\r\n\r\n"


class _Counting:
    """The socket's transport, counting the writes that reach it."""

    def __init__(self, transport, writes: list[int]) -> None:
        self._transport, self._writes = transport, writes

    def write(self, data: bytes) -> None:
        self._writes.append(len(data))
        self._transport.write(data)

    def __getattr__(self, name):
        return getattr(self._transport, name)


def _counted(base: type, writes: list[int]) -> type:
    class Counted(base):
        def connection_made(self, transport):  # below the coalescing layer: what reaches the socket
            super().connection_made(_Counting(transport, writes))
    return Counted


def _app(chunk_seen: threading.Event):
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"first;", "more_body": True})
            # the next chunk only once the client has read the first: held back, this would hang
            ok = await asyncio.get_running_loop().run_in_executor(None, chunk_seen.wait, 10)
            await send({"type": "http.response.body", "body": b"second" if ok else b"late", "more_body": False})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]})
        await send({"type": "http.response.body", "body": BODY})
    return app


def _get(url: str, path: bytes, seen: threading.Event | None = None) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(REQUEST % path)
        data = b""
        while not data.endswith(b"}") and not data.endswith(b"0\r\n\r\n"):
            part = s.recv(65536)
            if not part:
                break
            data += part
            if seen is not None and b"first;" in data:
                seen.set()
        return data


def _serve_counted(base: type, path: bytes) -> tuple[bytes, list[int]]:
    writes: list[int] = []
    seen = threading.Event()
    with serve_in_thread(_app(seen), http=_counted(base, writes), loop="uvloop") as url:
        reply = _get(url, path, seen if path == b"stream" else None)
    return reply, writes


def test_a_non_streamed_answer_is_one_write_with_uvicorns_bytes():
    reply, writes = _serve_counted(CoalescingHttpTools, b"json")
    plain_reply, plain_writes = _serve_counted(HttpToolsProtocol, b"json")
    assert len(plain_writes) == 2  # uvicorn alone: the head, then the body
    assert len(writes) == 1 and writes[0] == len(reply)
    assert reply.endswith(BODY) and reply.startswith(b"HTTP/1.1 200 OK\r\n")
    # the same bytes but the Date header's value (it may have ticked between the two servers)
    strip_date = lambda r: b"\r\n".join(x for x in r.split(b"\r\n") if not x.startswith(b"date:"))  # noqa: E731
    assert strip_date(reply) == strip_date(plain_reply)


def test_a_streamed_chunk_leaves_before_the_next_is_produced():
    reply, writes = _serve_counted(CoalescingHttpTools, b"stream")
    assert b"first;" in reply and b"second" in reply and b"late" not in reply
    assert len(writes) == 2  # head + first chunk in one write; the last chunk and terminator in the other


def test_keep_alive_serves_several_answers_in_order():
    seen = threading.Event()
    with serve_in_thread(_app(seen), http=CoalescingHttpTools, loop="uvloop") as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(REQUEST % b"a" + REQUEST % b"b")  # pipelined
            data = b""
            while data.count(BODY) < 2:
                part = s.recv(65536)
                assert part, "connection closed early"
                data += part
    assert data.count(b"HTTP/1.1 200 OK") == 2
