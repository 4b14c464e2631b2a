"""The Anthropic Messages API, output side: `message` objects, the SSE event sequence
(`message_start`, `ping`, `content_block_start`, `content_block_delta` with `text_delta` /
`thinking_delta` / `input_json_delta`, `content_block_stop`, `message_delta` with `stop_reason`
and usage, `message_stop`; `error` on failure) and Anthropic-shaped errors
(`{"type": "error", "error": {"type", "message"}}`), rendered from a route's `Result` and
`Delta`s. Ids: the message is `msg_<call id>`, a `tool_use` block's id the recorded tool-call id.
A thinking block's `signature` is empty: the proxy signs nothing, and accepts what it is sent.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from harnessrl.proxy.surfaces.anthropic.request import RECORDED_HEADERS, to_request
from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.protocol import Delta, Request, Result
from harnessrl.proxy.surfaces.adapter import Adapter
from harnessrl.proxy.surfaces.blocks import Block, BlockStream, Event, blocks_of

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def error_body(err: ProxyError) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": error_type(err.status), "message": err.message}})


def error_response(err: ProxyError, headers: dict[str, str] | None = None) -> Response:
    """The HTTP answer for `err` on an Anthropic endpoint (a 503 says when to retry)."""
    if err.status == 503:
        headers = {**(headers or {}), "retry-after": "1"}
    return Response(error_body(err), err.status, headers, "application/json")


def _input(arguments: str) -> Any:
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        value = None
    # the model's arguments were not a JSON object: kept whole rather than dropped
    return value if isinstance(value, dict) else {"arguments": arguments}


def _block(b: Block, empty: bool = False) -> dict:
    if b.kind == "reasoning":
        return {"type": "thinking", "thinking": "" if empty else b.text, "signature": ""}
    if b.kind == "text":
        return {"type": "text", "text": "" if empty else b.text}
    return {"type": "tool_use", "id": b.call_id, "name": b.name, "input": {} if empty else _input(b.text)}


class MessagesWire:
    def __init__(self, req: Request, call_id: str, model: str) -> None:
        self.src: dict = (req.surface or {}).get("body") or {}
        self.id = f"msg_{call_id}"
        self.model = req.body.get("model") or model
        self._started = False
        self._blocks = BlockStream()

    def _stop(self, r: Result) -> tuple[str | None, str | None]:
        choice = ((r.raw or {}).get("choices") or [{}])[0]
        matched = choice.get("stop_reason")  # vLLM: the stop string that ended the answer
        if isinstance(matched, str) and matched in (self.src.get("stop_sequences") or ()):
            return "stop_sequence", matched
        return ("tool_use" if r.tool_calls else _STOP.get(r.finish_reason or "", "end_turn")), None

    @staticmethod
    def _usage(r: Result) -> dict:
        u = r.usage or {}
        return {"input_tokens": u.get("prompt_tokens", 0), "output_tokens": u.get("completion_tokens", 0),
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}

    def response(self, r: Result) -> dict:
        stop, seq = self._stop(r)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [_block(b) for b in blocks_of(r)], "stop_reason": stop, "stop_sequence": seq,
                "usage": self._usage(r)}

    # ---- stream ----------------------------------------------------------------------
    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        # the prompt's size is known once the answer is: message_delta carries it
        msg = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
               "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                         "cache_read_input_tokens": 0}}
        return self._event("message_start", message=msg) + self._event("ping")

    def _render(self, e: Event) -> bytes:
        b = e.block
        if e.op == "open":
            return self._event("content_block_start", index=e.index, content_block=_block(b, empty=True))
        if e.op == "piece":
            delta = ({"type": "text_delta", "text": e.piece} if b.kind == "text" else
                     {"type": "thinking_delta", "thinking": e.piece} if b.kind == "reasoning" else
                     {"type": "input_json_delta", "partial_json": e.piece})
            return self._event("content_block_delta", index=e.index, delta=delta)
        out = b""
        if b.kind == "reasoning":
            out = self._event("content_block_delta", index=e.index, delta={"type": "signature_delta", "signature": ""})
        return out + self._event("content_block_stop", index=e.index)

    def chunks(self, deltas: list[Delta]) -> bytes:
        return self._start() + b"".join(self._render(e) for e in self._blocks.feed(deltas))

    def close(self, result: Result) -> bytes:
        stop, seq = self._stop(result)
        usage = self._usage(result)
        return (self._start() + b"".join(self._render(e) for e in self._blocks.finish())
                + self._event("message_delta", delta={"stop_reason": stop, "stop_sequence": seq},
                              usage={"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]})
                + self._event("message_stop"))

    def error(self, err: ProxyError) -> bytes:
        return b"event: error\ndata: " + error_body(err) + b"\n\n"


MESSAGES = Adapter("messages", to_request, MessagesWire, error=error_response, headers=RECORDED_HEADERS)
