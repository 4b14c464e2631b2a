"""The OpenAI Responses API, output side: `response` objects and the streamed event sequence
(`response.created`, `response.in_progress`, `response.output_item.added`,
`response.content_part.added`, `response.output_text.delta`/`.done`,
`response.reasoning_text.delta`/`.done`, `response.function_call_arguments.delta`/`.done`,
`response.output_item.done`, `response.completed` — or `response.incomplete` when cut at
`max_output_tokens`, `error` + `response.failed` on failure), all rendered from a route's
`Result` and `Delta`s (never from an upstream's raw OpenAI body).

Ids: the response is `resp_<call id>`; output items are `rs_`/`msg_`/`fc_<call id>_<position>`;
a function call's `call_id` is the tool-call id of the recorded chat message. A call of a
namespaced, custom or tool-search tool comes back as the harness declared it
(`surfaces.responses.tools.call_item`): a `function_call` with `namespace`, a `custom_tool_call` whose
input is streamed whole when the call is complete (`response.custom_tool_call_input.delta` /
`.done`), since the model writes it as a JSON string that can only be decoded once closed, or a
`tool_search_call` (its arguments an object, in `response.output_item.done` alone).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.protocol import Delta, Request, Result
from harnessrl.proxy.surfaces.responses.request import LOGPROBS_INCLUDE, RESPONSE_PREFIX, resolve, to_request
from harnessrl.proxy.surfaces.responses.tools import call_item
from harnessrl.proxy.surfaces.adapter import Adapter
from harnessrl.proxy.surfaces.blocks import Block, BlockStream, Event, blocks_of

_ITEM_PREFIX = {"reasoning": "rs", "text": "msg", "tool": "fc"}


def token_logprobs(r: Result) -> list[dict]:
    """Per-token log-probs of the answer as Responses `logprobs` entries."""
    if r.tokens is not None and r.logprobs is not None:
        pairs = zip(r.tokens, r.logprobs)
    else:  # a pass-through answer: the upstream's own chat log-probs
        choice = ((r.raw or {}).get("choices") or [{}])[0]
        pairs = ((c.get("token"), c.get("logprob")) for c in ((choice.get("logprobs") or {}).get("content") or ()))
    return [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []} for t, lp in pairs]


def usage(u: dict | None) -> dict:
    u = u or {}
    n_in, n_out = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
    return {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": n_in + n_out}


class ResponsesWire:
    def __init__(self, req: Request, call_id: str, model: str) -> None:
        self.src: dict = (req.surface or {}).get("body") or {}
        self.call_id = call_id
        self.model = req.body.get("model") or model
        self.created = int(time.time())
        self.logprobs = LOGPROBS_INCLUDE in (self.src.get("include") or ())
        self._seq = 0
        self._started = False
        self._blocks = BlockStream()
        self.names: dict = (req.surface or {}).get("tool_names") or {}

    # ---- objects ---------------------------------------------------------------------
    def _head(self, status: str) -> dict:
        s = self.src
        return {"id": RESPONSE_PREFIX + self.call_id, "object": "response", "created_at": self.created,
                "status": status, "model": self.model, "output": [], "error": None, "incomplete_details": None,
                "instructions": s.get("instructions"), "previous_response_id": s.get("previous_response_id"),
                "tools": s.get("tools") or [], "tool_choice": s.get("tool_choice") or "auto",
                "parallel_tool_calls": s.get("parallel_tool_calls", True), "temperature": s.get("temperature"),
                "top_p": s.get("top_p"), "max_output_tokens": s.get("max_output_tokens"),
                "store": s.get("store", True), "text": s.get("text") or {"format": {"type": "text"}},
                "reasoning": s.get("reasoning"), "metadata": s.get("metadata") or {},
                "truncation": s.get("truncation") or "disabled", "background": False, "usage": None}

    def _item(self, i: int, b: Block, status: str, logprobs: list | None = None) -> dict:
        item_id = f"{_ITEM_PREFIX[b.kind]}_{self.call_id}_{i}"
        if b.kind == "reasoning":
            return {"id": item_id, "type": "reasoning", "summary": [], "status": status,
                    "content": [{"type": "reasoning_text", "text": b.text}]}
        if b.kind == "text":
            return {"id": item_id, "type": "message", "role": "assistant", "status": status,
                    "content": [self._part(b.text, logprobs)]}
        return {"id": item_id, **call_item(self.names, b.name, b.text), "call_id": b.call_id, "status": status}

    def _kind(self, b: Block) -> str:
        return (self.names.get(b.name or "") or [None, None, "function"])[2]

    @staticmethod
    def _part(text: str, logprobs: list | None = None) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}

    def response(self, r: Result) -> dict:
        cut = r.finish_reason == "length"
        out = self._head("incomplete" if cut else "completed")
        lps = token_logprobs(r) if self.logprobs else None
        items, first_text = [], True
        for i, b in enumerate(blocks_of(r)):
            items.append(self._item(i, b, "incomplete" if cut else "completed", lps if first_text else None))
            first_text = first_text and b.kind != "text"
        out.update(output=items, usage=usage(r.usage), completed_at=int(time.time()))
        if cut:
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        return out

    # ---- stream ----------------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        head = self._head("in_progress")
        return self._event("response.created", response=head) + self._event("response.in_progress", response=head)

    def _render(self, e: Event) -> bytes:
        i, b = e.index, e.block
        item_id = f"{_ITEM_PREFIX[b.kind]}_{self.call_id}_{i}"
        at = {"item_id": item_id, "output_index": i}
        if e.op == "open":
            skeleton = self._item(i, Block(b.kind, "", b.call_id, b.name), "in_progress")
            out = self._event("response.output_item.added", output_index=i, item=skeleton)
            if b.kind == "text":
                out += self._event("response.content_part.added", **at, content_index=0, part=self._part(""))
            return out
        if e.op == "piece":
            if b.kind == "text":
                return self._event("response.output_text.delta", **at, content_index=0, delta=e.piece, logprobs=[])
            if b.kind == "reasoning":
                return self._event("response.reasoning_text.delta", **at, content_index=0, delta=e.piece)
            if self._kind(b) != "function":  # streamed whole once complete (see the module's doc)
                return b""
            return self._event("response.function_call_arguments.delta", **at, delta=e.piece)
        item = self._item(i, b, "completed")
        if b.kind == "text":
            out = self._event("response.output_text.done", **at, content_index=0, text=b.text, logprobs=[])
            out += self._event("response.content_part.done", **at, content_index=0, part=self._part(b.text))
        elif b.kind == "reasoning":
            out = self._event("response.reasoning_text.done", **at, content_index=0, text=b.text)
        elif self._kind(b) == "custom":
            out = self._event("response.custom_tool_call_input.delta", **at, delta=item["input"])
            out += self._event("response.custom_tool_call_input.done", **at, input=item["input"])
        elif self._kind(b) == "tool_search":  # its arguments are an object: in the item alone
            out = b""
        else:
            out = self._event("response.function_call_arguments.done", **at, name=item["name"], arguments=b.text)
        return out + self._event("response.output_item.done", output_index=i, item=item)

    def warmup(self) -> bytes:
        """The events of a WebSocket warm-up (`generate: false`): a response without output."""
        done = self._head("completed")
        done.update(usage=usage(None), completed_at=int(time.time()))
        return self._start() + self._event("response.completed", response=done)

    def chunks(self, deltas: list[Delta]) -> bytes:
        return self._start() + b"".join(self._render(e) for e in self._blocks.feed(deltas))

    def close(self, result: Result) -> bytes:
        out = self._start() + b"".join(self._render(e) for e in self._blocks.finish())
        final = self.response(result)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=final)

    def error(self, err: ProxyError) -> bytes:
        failed = self._head("failed")
        failed["error"] = {"code": err.code or err.type, "message": err.message}
        return (self._start() + self._event("error", code=err.code or err.type, message=err.message, param=err.param)
                + self._event("response.failed", response=failed))


RESPONSES = Adapter("responses", to_request, ResponsesWire, resolve=resolve)
