"""Text-only route: chat calls to a hosted model that speaks another dialect (Anthropic
Messages, OpenAI Responses) and returns no token ids or log-probs. A `Dialect` names the path,
translates the internal chat body, reads the answer (whole or streamed) and the errors; the
route does the HTTP and the streaming. Calls are recorded with `prompt_path = text-only`, so
compile never trains on them (they can be expert traces)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from harnessrl.proxy.errors import ProxyError, UpstreamMalformed, bad_request
from harnessrl.proxy.upstream.http_pool import Pool
from harnessrl.proxy.prefix.prompts import Turn
from harnessrl.proxy.protocol import Delta, Prompt, Request, Result
from harnessrl.proxy.upstream.vllm_wire import sse_events
from harnessrl.records import TEXT_ONLY


def read_event(payload: bytes) -> tuple[str, dict]:
    """(type, event) of one streamed JSON event; anything else is the upstream's malformed answer."""
    try:
        ev = orjson.loads(payload)
        return ev["type"], ev
    except Exception as exc:  # noqa: BLE001 - whatever the shape, it is the upstream's error
        raise UpstreamMalformed(f"stream event {payload[:200]!r}: {exc}") from None


class Assembler(Protocol):
    def feed(self, payload: bytes) -> Delta | None: ...

    def finish(self) -> Result: ...


@dataclass(frozen=True)
class Dialect:
    name: str  # as in --upstream-dialect
    path: str  # the upstream's endpoint
    request: Callable[[dict, int], dict]  # (chat body, default max_tokens) -> the dialect's body
    result: Callable[[dict], Result]  # the dialect's whole answer -> Result
    assembler: Callable[[], Assembler]  # a fresh stream reader
    error: Callable[[int, bytes], ProxyError]  # (HTTP status, body) -> the harness's error


class TextOnlyRoute:
    eos_ids: frozenset[int] = frozenset()

    def __init__(self, dialect: Dialect, pool: Pool, model_name: str, default_max_tokens: int,
                 upstream_model: str | None = None) -> None:
        self.dialect = dialect
        self.pool = pool  # sends the key as the dialect wants it (httpclient.credential_headers)
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        self.upstream_model = upstream_model  # sent as `model` whatever the harness asked for

    async def prompt(self, req: Request, turn: Turn | None) -> Prompt:
        if not req.chat:
            raise bad_request(f"the {self.dialect.name} upstream dialect serves chat calls only",
                              code="unsupported_endpoint")
        return Prompt(TEXT_ONLY, turn.call_id if turn else None, turn=turn)

    def _body(self, req: Request, stream: bool) -> bytes:
        body: dict[str, Any] = {**self.dialect.request(req.body, self.default_max_tokens), "stream": stream}
        if self.upstream_model is not None:
            body["model"] = self.upstream_model
        return orjson.dumps(body)

    async def run(self, req: Request, prompt: Prompt) -> Result:
        resp = await (req.upstream or self.pool).request("POST", self.dialect.path, self._body(req, False))
        if resp.status != 200:
            raise self.dialect.error(resp.status, resp.body)
        try:
            data = orjson.loads(resp.body)
        except orjson.JSONDecodeError as exc:
            raise UpstreamMalformed(exc) from None
        if not isinstance(data, dict):
            raise UpstreamMalformed(f"expected a JSON object, got {resp.body[:200]!r}")
        return self.dialect.result(data)

    async def stream(self, req: Request, prompt: Prompt) -> AsyncIterator[list[Delta] | Result]:
        resp, chunks = await (req.upstream or self.pool).stream("POST", self.dialect.path, self._body(req, True))
        if resp.status != 200:
            raise self.dialect.error(resp.status, b"".join([c async for c in chunks]))
        asm = self.dialect.assembler()
        buf = bytearray()
        events = 0
        async for data in chunks:
            payloads = sse_events(buf, data)
            events += len(payloads)
            batch = [d for payload in payloads if (d := asm.feed(payload)) is not None]
            if batch:
                yield batch
        if not events and buf.strip():  # not SSE: the dialect's error answered with status 200, or junk
            raise self._not_sse(bytes(buf))
        result = asm.finish()
        tail = [Delta(finish_reason=result.finish_reason, terminal=True)]
        if req.include_usage:
            tail.append(Delta(usage=result.usage, terminal=True))
        yield tail
        yield result

    def _not_sse(self, body: bytes) -> ProxyError:
        try:
            said = isinstance(orjson.loads(body).get("error"), dict)
        except Exception:  # noqa: BLE001 - not a JSON object
            said = False
        if said:  # the dialect's own error body: its words
            return self.dialect.error(502, body)
        return UpstreamMalformed(f"the stream held no SSE event: {body[:200]!r}")
