"""An upstream that answers every request with exactly the bytes a test gives it, on a real
socket: the faults a well-behaved server library would never produce (a stream cut mid-event, an
HTTP 200 whose SSE body holds an error, a stream with no stop reason) reach the proxy as sent."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def http_response(body: bytes, content_type: str = "text/event-stream", status: str = "200 OK") -> bytes:
    """A whole HTTP/1.1 response (the connection closes after it)."""
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


def sse(*events: bytes | str) -> bytes:
    """`data:` events (str: sent as is after `data: `; bytes: a whole event, as is)."""
    return b"".join(e if isinstance(e, bytes) else f"data: {e}\n\n".encode() for e in events)


class RawUpstream:
    """`reply`: the bytes every request gets; `requests`: the request bodies seen."""

    def __init__(self) -> None:
        self.reply = http_response(b"{}", "application/json")
        self.requests: list[bytes] = []
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                got = conn.recv(65536)
                if not got:
                    return
                data += got
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                got = conn.recv(65536)
                if not got:
                    return
                body += got
            self.requests.append(body)
            conn.sendall(self.reply)

    def close(self) -> None:
        self._sock.close()


@contextmanager
def raw_upstream() -> Iterator[RawUpstream]:
    up = RawUpstream()
    try:
        yield up
    finally:
        up.close()
