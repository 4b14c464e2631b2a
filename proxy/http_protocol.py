"""uvicorn's httptools protocol, with one socket write per response instead of two.

uvicorn writes a response's head when the app sends `http.response.start` and its body when it
sends `http.response.body`: two `send` system calls, and on loopback two TCP segments that wake
the harness twice. In a profile of the proxy under load the head's write was the largest single
cost (10–18% of the proxy's CPU, the body's 2–3%). Here the transport holds what is written
during one event-loop iteration and sends it as one write at the iteration's end: a
non-streaming answer (head and body are sent in the same step of its task) becomes one segment;
a stream's chunks still go out as soon as its task waits for the next one.

Cost: one `call_soon` per burst of writes. Ordering is kept (every write goes through the
buffer); `close()` sends what is held first; an `abort()` drops it, as it drops the kernel's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CoalescingTransport:
    """A transport whose writes within one loop iteration go out as one `write`."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def writelines(self, lines) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str) -> Any:  # pause/resume_reading, get_extra_info, is_closing, abort, ...
        return getattr(self._transport, name)


class CoalescingHttpTools(HttpToolsProtocol):
    """The protocol class the proxy gives uvicorn (`Config(http=...)`)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
