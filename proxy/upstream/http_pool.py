"""A small keep-alive HTTP/1.1 client pool on asyncio + httptools.

The proxy forwards every harness call to the upstream; a general client (httpx) costs
several hundred microseconds per request, which alone would cap the proxy well below the
throughput it is meant to reach. This one does only what the proxy needs: POST/GET with a
JSON body to one host, keep-alive pooling, whole-body or streamed responses, timeouts, and TLS
for an `https://` upstream (a hosted teacher, a vLLM behind a TLS terminator) with certificate
and host-name verification against the system store or a given CA file.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools


class UpstreamConnectionError(ConnectionError):
    """The upstream could not be reached or dropped the connection."""


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class _Conn(asyncio.Protocol):
    """One TCP connection; parses one response at a time."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self._parser = httptools.HttpResponseParser(self)
        self._reset(False)

    def _reset(self, streaming: bool) -> None:
        loop = self._pool.loop
        self.got_bytes = False
        self._streaming = streaming
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._head = loop.create_future()  # resolves at headers complete
        self._done = loop.create_future()  # resolves at message complete
        self._chunks: asyncio.Queue[bytes | None] | None = asyncio.Queue() if streaming else None
        self._keep_alive = False
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, timeout: float) -> None:
        """(Re)start the inactivity timer: no byte from the upstream for `timeout` s fails the request."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._pool.loop.call_later(timeout, self._timed_out)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        self._fail(asyncio.TimeoutError())
        self.close()

    # asyncio.Protocol
    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        if self._streaming and self._timer is not None:
            self.arm(self._pool.timeout)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamConnectionError(f"bad HTTP response from upstream: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.disarm()
        self._fail(UpstreamConnectionError("upstream closed the connection"))

    def _fail(self, exc: Exception) -> None:
        for fut in (self._head, self._done):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # mark retrieved: the other one is what gets awaited
        if self._chunks is not None:
            self._chunks.put_nowait(None)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._chunks is not None:
            self._chunks.put_nowait(body)
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self.disarm()
        if self._chunks is not None:
            self._chunks.put_nowait(None)
        if not self._done.done():
            self._done.set_result(None)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def send(self, data: bytes, streaming: bool) -> None:
        self._reset(streaming)
        assert self.transport is not None
        self.arm(self._pool.timeout)
        self.transport.write(data)


def credential_headers(dialect: str, api_key: str | None) -> dict[str, str]:
    """The upstream key as the dialect sends it: a bearer token for OpenAI-style servers,
    `x-api-key` (with the API version every request must name) for Anthropic."""
    if dialect == "anthropic":
        return {"x-api-key": api_key, "anthropic-version": "2023-06-01"} if api_key else {"anthropic-version": "2023-06-01"}
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def tls_context(ca_file: str | None = None) -> ssl.SSLContext:
    """Verifying client context: the system's CA store, or only `ca_file` when given."""
    return ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()


class Pool:
    """Keep-alive connections to one `http[s]://host[:port][/prefix]` base URL. `credentials`:
    headers sent on every request (the upstream key, as its dialect wants it — see
    `credential_headers`); the harness's own credentials are never forwarded."""

    def __init__(self, base_url: str, timeout: float = 600.0, max_idle: int = 512, ca_file: str | None = None,
                 credentials: dict[str, str] | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream URL must be http[s]://host[:port][/prefix], got {base_url!r}")
        self.host = parts.hostname
        self.tls = tls_context(ca_file) if parts.scheme == "https" else None
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        default_port = self.port == (443 if self.tls else 80)
        self._host_header = (self.host if default_port else f"{self.host}:{self.port}").encode()
        self._credentials = [f"{k}: {v}".encode("latin-1") for k, v in (credentials or {}).items()]
        self._idle: deque[_Conn] = deque()
        self._max_idle = max_idle
        self.loop = asyncio.get_running_loop()

    async def _acquire(self) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _Conn(self), self.host, self.port, ssl=self.tls), self.timeout
            )
        except ssl.SSLCertVerificationError as exc:
            raise UpstreamConnectionError(f"TLS certificate of upstream {self.host}:{self.port} not trusted: "
                                          f"{exc.verify_message} (give its CA with --upstream-ca)") from exc
        except (OSError, asyncio.TimeoutError) as exc:
            raise UpstreamConnectionError(f"cannot connect to upstream {self.host}:{self.port}: {exc}") from exc
        return conn

    def _release(self, conn: _Conn) -> None:
        if conn.closed or not conn._keep_alive or len(self._idle) >= self._max_idle:
            conn.close()
        else:
            self._idle.append(conn)

    def _request_bytes(self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None) -> bytes:
        head = [f"{method} {self.prefix}{path} HTTP/1.1".encode(), b"Host: " + self._host_header]
        head.extend(self._credentials)
        if body is not None:
            head.append(b"Content-Type: application/json")
            head.append(b"Content-Length: " + str(len(body)).encode())
        for k, v in (headers or {}).items():
            head.append(f"{k}: {v}".encode("latin-1"))
        return b"\r\n".join(head) + b"\r\n\r\n" + (body or b"")

    async def _send(self, data: bytes, streaming: bool) -> _Conn:
        """Send on a pooled connection; a reused one that the server had closed is retried once
        on a fresh connection (nothing was received, so the request never ran)."""
        for attempt in range(2):
            conn = await self._acquire()
            conn.send(data, streaming)
            try:
                await conn._head
                return conn
            except UpstreamConnectionError:
                conn.close()
                if attempt == 0 and conn.reused and not conn.got_bytes:
                    continue
                raise
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")

    async def request(self, method: str, path: str, body: bytes | None = None,
                      headers: dict[str, str] | None = None) -> Response:
        conn = await self._send(self._request_bytes(method, path, body, headers), streaming=False)
        try:
            await conn._done
        except BaseException:
            conn.close()
            raise
        resp = Response(conn._status, conn._headers, b"".join(conn._body))
        self._release(conn)
        return resp

    async def stream(self, method: str, path: str, body: bytes | None = None,
                     headers: dict[str, str] | None = None) -> tuple[Response, AsyncIterator[bytes]]:
        """Status and headers, then the body as it arrives (chunked encoding already removed)."""
        conn = await self._send(self._request_bytes(method, path, body, headers), streaming=True)
        resp = Response(conn._status, conn._headers)

        async def chunks() -> AsyncIterator[bytes]:
            assert conn._chunks is not None
            finished = False
            queue = conn._chunks
            try:
                ended = False
                while not ended:
                    chunk = await queue.get()
                    if chunk is None:
                        break
                    if not queue.empty():
                        # what arrived together goes on together: one parse and one write downstream
                        # per wake-up, not per chunk (under load the upstream runs ahead of the proxy)
                        parts = [chunk]
                        while not queue.empty():
                            more = queue.get_nowait()
                            if more is None:
                                ended = True
                                break
                            parts.append(more)
                        chunk = b"".join(parts)
                    yield chunk
                if conn._done.done() and conn._done.exception() is not None:
                    raise conn._done.exception()  # type: ignore[misc]
                finished = conn._done.done()
            finally:
                if finished:
                    self._release(conn)
                else:
                    conn.close()

        return resp, chunks()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
