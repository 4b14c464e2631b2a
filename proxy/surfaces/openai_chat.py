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
from harnessrl.proxy.fanout import check_best_of
from harnessrl.proxy.protocol import Delta, Request, Result
from harnessrl.proxy.surfaces.adapter import Adapter
from harnessrl.proxy.validate import check_chat, check_completion

SSE_DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def sse_error(err: ProxyError) -> bytes:
    """The event that ends a stream that failed after its 200 (the openai SDK raises on it)."""
    return b"data: " + err.body() + b"\n\n"


def _alt(t: str, lp: float) -> dict:
    return {"token": t, "logprob": lp, "bytes": list(t.encode())}


def chat_logprobs(pairs: Any, tops: list | None = None) -> dict:
    """`choices[].logprobs` of a chat response or chunk from (token text, log-prob) pairs and,
    when asked for, each token's top-k alternatives."""
    return {"content": [{**_alt(t, lp), "top_logprobs": [_alt(a, alp) for a, alp in tops[i]] if tops else []}
                        for i, (t, lp) in enumerate(pairs)]}


def text_logprobs(tokens: list[str], logprobs: list[float], tops: list | None = None) -> dict:
    """`choices[].logprobs` of a Completions response or chunk."""
    return {"tokens": tokens, "token_logprobs": list(logprobs),
            "top_logprobs": [dict(alts) for alts in tops] if tops else None, "text_offset": None}


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
        lp = (chat_logprobs(list(zip(result.tokens, result.logprobs or ())), result.top_logprobs)
              if self.req.logprobs and result.tokens is not None else None)
        choice = {"index": 0, "message": result.message, "finish_reason": result.finish_reason, "logprobs": lp}
        out = {**self.head, "object": "chat.completion", "choices": [choice], "usage": result.usage}
        if self.req.token_ids:  # vLLM's fields, for a harness that asked for them
            out["prompt_token_ids"], choice["token_ids"] = result.prompt_ids, result.completion_ids
        return out

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
        lp = chat_logprobs(d.logprobs, d.top_logprobs) if d.logprobs is not None else None
        choice = {"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": d.finish_reason}
        out = {**self.head, "object": "chat.completion.chunk", "choices": [choice]}
        _ids(out, choice, d)
        return out


class TextWire(_Wire):
    """Completions: `text_completion` objects, streamed and not."""

    def __init__(self, req: Request, call_id: str, model: str) -> None:
        super().__init__(req, {"id": f"cmpl-{call_id}", "created": int(time.time()),
                               "model": req.body.get("model") or model, "object": "text_completion"})

    def response(self, result: Result) -> dict:
        if result.raw is not None:
            return result.raw
        lp = (text_logprobs(result.tokens, result.logprobs or [], result.top_logprobs)
              if self.req.logprobs and result.tokens is not None else None)
        choice = {"index": 0, "text": result.text, "finish_reason": result.finish_reason, "logprobs": lp}
        if self.req.token_ids:
            choice["prompt_token_ids"], choice["token_ids"] = result.prompt_ids, result.completion_ids
        return {**self.head, "choices": [choice], "usage": result.usage}

    def _chunk(self, d: Delta) -> dict:
        if d.usage is not None:
            return {**self.head, "choices": [], "usage": d.usage}
        lp = (text_logprobs([t for t, _ in d.logprobs], [v for _, v in d.logprobs], d.top_logprobs)
              if d.logprobs is not None else None)
        choice = {"index": d.index, "text": d.content or "", "finish_reason": d.finish_reason, "logprobs": lp}
        if d.token_ids is not None:
            choice["token_ids"] = d.token_ids
        if d.prompt_ids is not None:
            choice["prompt_token_ids"] = d.prompt_ids
        return {**self.head, "choices": [choice]}


def _ids(out: dict, choice: dict, d: Delta) -> None:
    """vLLM's token-id fields on a chat chunk (prompt ids at the top of the first)."""
    if d.token_ids is not None:
        choice["token_ids"] = d.token_ids
    if d.prompt_ids is not None:
        out["prompt_token_ids"] = d.prompt_ids


def _chat_request(body: dict) -> Request:
    check_chat(body)
    return Request(body, chat=True)


def _text_request(body: dict) -> Request:
    check_completion(body)
    check_best_of(body)
    return Request(body, chat=False)


CHAT_COMPLETIONS = Adapter("chat/completions", _chat_request, ChatWire)
COMPLETIONS = Adapter("completions", _text_request, TextWire)
