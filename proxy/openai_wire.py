"""The OpenAI wire format on the way out: responses, stream chunks, log-prob objects and SSE
framing for Chat Completions and Completions, built from a route's `Result` and `Delta`s.

`CHAT_COMPLETIONS` and `COMPLETIONS` are the OpenAI adapters: the request side is the body
itself (OpenAI chat is the internal shape), the output side `ChatWire` / `TextWire` (one per
call). Another API surface (Responses, Anthropic Messages) is a module like this one: an
`Adapter` whose request function translates to a chat `Request`, and a wire class with the
same methods.
A pass-through route's deltas and results carry the upstream's own OpenAI objects (`raw`):
they go out as they are.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.protocol import Delta, Request, Result
from harnessrl.proxy.serving import Adapter
from harnessrl.proxy.validate import check_chat, check_completion

SSE_DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def sse_error(err: ProxyError) -> bytes:
    """The event that ends a stream that failed after its 200 (the openai SDK raises on it)."""
    return b"data: " + err.body() + b"\n\n"


def chat_logprobs(pairs: Any) -> dict:
    """`choices[].logprobs` of a chat response or chunk from (token text, log-prob) pairs."""
    return {"content": [{"token": t, "logprob": lp, "bytes": None, "top_logprobs": []} for t, lp in pairs]}


def text_logprobs(tokens: list[str], logprobs: list[float]) -> dict:
    """`choices[].logprobs` of a Completions response."""
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None, "text_offset": None}


class _Wire:
    def __init__(self, req: Request, head: dict) -> None:
        self.req = req
        self.head = head

    def chunks(self, deltas: list[Delta]) -> bytes:
        """The SSE events for deltas that go out together."""
        return b"".join(sse(d.raw if d.raw is not None else self._chunk(d)) for d in deltas)

    def close(self, _result: Result) -> bytes:
        return SSE_DONE

    def error(self, err: ProxyError) -> bytes:
        return sse_error(err)

    def _chunk(self, d: Delta) -> dict:
        raise NotImplementedError


class ChatWire(_Wire):
    """Chat Completions: `chat.completion` and `chat.completion.chunk` objects."""

    def __init__(self, req: Request, call_id: str, model: str) -> None:
        super().__init__(req, {"id": f"chatcmpl-{call_id}", "created": int(time.time()),
                               "model": req.body.get("model") or model})

    def response(self, result: Result) -> dict:
        if result.raw is not None:
            return result.raw
        lp = (chat_logprobs(zip(result.tokens, result.logprobs or ()))
              if self.req.logprobs and result.tokens is not None else None)
        choice = {"index": 0, "message": result.message, "finish_reason": result.finish_reason, "logprobs": lp}
        return {**self.head, "object": "chat.completion", "choices": [choice], "usage": result.usage}

    def _chunk(self, d: Delta) -> dict:
        if d.usage is not None:
            return {**self.head, "object": "chat.completion.chunk", "choices": [], "usage": d.usage}
        delta: dict[str, Any] = {}
        if d.role is not None:
            delta["role"] = d.role
        if d.content is not None:
            delta["content"] = d.content
        if d.reasoning is not None:
            delta["reasoning"] = d.reasoning
        if d.tool_calls:
            delta["tool_calls"] = d.tool_calls
        lp = chat_logprobs(d.logprobs) if d.logprobs is not None else None
        return {**self.head, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": d.finish_reason}]}


class TextWire(_Wire):
    """Completions: `text_completion` objects, streamed and not."""

    def __init__(self, req: Request, call_id: str, model: str) -> None:
        super().__init__(req, {"id": f"cmpl-{call_id}", "created": int(time.time()),
                               "model": req.body.get("model") or model, "object": "text_completion"})

    def response(self, result: Result) -> dict:
        if result.raw is not None:
            return result.raw
        lp = (text_logprobs(result.tokens, result.logprobs or [])
              if self.req.logprobs and result.tokens is not None else None)
        return {**self.head, "choices": [{"index": 0, "text": result.text, "finish_reason": result.finish_reason,
                                          "logprobs": lp}], "usage": result.usage}

    def _chunk(self, d: Delta) -> dict:
        if d.usage is not None:
            return {**self.head, "choices": [], "usage": d.usage}
        return {**self.head, "choices": [{"index": 0, "text": d.content or "", "finish_reason": d.finish_reason,
                                          "logprobs": None}]}


def _chat_request(body: dict) -> Request:
    check_chat(body)
    return Request(body, chat=True)


def _text_request(body: dict) -> Request:
    check_completion(body)
    return Request(body, chat=False)


CHAT_COMPLETIONS = Adapter("chat/completions", _chat_request, ChatWire)
COMPLETIONS = Adapter("completions", _text_request, TextWire)
