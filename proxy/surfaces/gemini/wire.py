"""The Gemini API, output side: `GenerateContentResponse` objects (one candidate; its content's
parts: `thought` text, text, `functionCall` with the recorded tool-call id; `finishReason`,
`usageMetadata`, `logprobsResult` when asked), the two stream forms (`alt=sse`: one `data:` event
per chunk; without it one JSON array whose elements arrive as they are made), and Gemini-shaped
errors (`{"error": {"code", "message", "status", "details"}}`), rendered from a route's `Result`
and `Delta`s. A function call is sent whole, in the chunk where it ends (as Gemini does); the last
chunk carries `finishReason` and `usageMetadata`. The response id is the call id."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.protocol import Delta, Request, Result
from harnessrl.proxy.surfaces.adapter import Adapter
from harnessrl.proxy.surfaces.blocks import Block, BlockStream, Event, blocks_of
from harnessrl.proxy.surfaces.gemini.request import to_request
from harnessrl.proxy.surfaces.gemini.thoughts import sign

_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           409: "ABORTED", 410: "FAILED_PRECONDITION", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
           499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
           504: "DEADLINE_EXCEEDED"}


def status_of(code: int) -> str:
    return _STATUS.get(code, "INVALID_ARGUMENT" if code < 500 else "INTERNAL")


def error_body(err: ProxyError) -> bytes:
    """Gemini's error: google.rpc.Status, with the field (a BadRequest) and the proxy's own code (an
    ErrorInfo reason) in its details."""
    details: list[dict] = []
    if err.param and err.status == 400:
        details.append({"@type": "type.googleapis.com/google.rpc.BadRequest",
                        "fieldViolations": [{"field": err.param, "description": err.message}]})
    if err.code:
        details.append({"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": err.code,
                        "domain": "harnessrl"})
    error: dict[str, Any] = {"code": err.status, "message": err.message, "status": status_of(err.status)}
    if details:
        error["details"] = details
    return orjson.dumps({"error": error})


def error_response(err: ProxyError, headers: dict[str, str] | None = None) -> Response:
    """The HTTP answer for `err` on a Gemini endpoint (a 503 says when to retry)."""
    if err.status == 503:
        headers = {**(headers or {}), "retry-after": "1"}
    return Response(error_body(err), err.status, headers, "application/json")


def _args(arguments: str) -> dict:
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        value = None
    # the model's arguments were not a JSON object: kept whole rather than dropped
    return value if isinstance(value, dict) else {"arguments": arguments}


def _part(b: Block) -> dict:
    if b.kind == "reasoning":
        return {"text": b.text, "thought": True}
    if b.kind == "text":
        return {"text": b.text}
    return {"functionCall": {"id": b.call_id, "name": b.name, "args": _args(b.text)}}


def _sign_first(parts: list[dict], reasoning: str) -> bool:
    """Put the reasoning in a `thoughtSignature` (`surfaces.gemini.thoughts`) on the first part
    after the thoughts — the first a client that drops thoughts keeps; whether there was one."""
    first = next((p for p in parts if not p.get("thought")), None)
    if first is not None and reasoning:
        first["thoughtSignature"] = sign(reasoning)
    return first is not None


def _logprobs(tokens: list[tuple[str, float]], top: list[list[tuple[str, float]]] | None) -> dict:
    out: dict[str, Any] = {"chosenCandidates": [{"token": t, "logProbability": lp} for t, lp in tokens],
                           "logProbabilitySum": sum(lp for _, lp in tokens)}
    if top:
        out["topCandidates"] = [{"candidates": [{"token": t, "logProbability": lp} for t, lp in alts]}
                                for alts in top]
    return out


class GeminiWire:
    def __init__(self, req: Request, call_id: str, model: str) -> None:
        surface = req.surface or {}
        self.id = call_id
        self.model = surface.get("model") or req.body.get("model") or model
        self.sse = surface.get("alt", "sse") == "sse"
        self.media_type = "text/event-stream" if self.sse else "application/json"
        self._logprobs = bool(req.body.get("logprobs"))
        self._sent = False  # the JSON-array stream: whether its "[" went out
        self._signed = False  # the stream: whether a part after its thoughts went out (signed)
        self._blocks = BlockStream()

    def _answer(self, parts: list[dict], finish: str | None = None, usage: dict | None = None,
                logprobs: dict | None = None) -> dict:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish is not None:
            candidate["finishReason"] = finish
        if logprobs is not None:
            candidate["logprobsResult"] = logprobs
            n = len(logprobs["chosenCandidates"])
            if n:
                candidate["avgLogprobs"] = logprobs["logProbabilitySum"] / n
        out: dict[str, Any] = {"candidates": [candidate]}
        if usage is not None:
            out["usageMetadata"] = usage
        out["modelVersion"] = self.model
        out["responseId"] = self.id
        return out

    @staticmethod
    def _usage(r: Result) -> dict:
        u = r.usage or {}
        prompt, completion = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
        return {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion}

    @staticmethod
    def _finish(r: Result) -> str:
        return _FINISH.get(r.finish_reason or "stop", "OTHER")

    def response(self, r: Result) -> dict:
        blocks = blocks_of(r)
        parts = [_part(b) for b in blocks]
        _sign_first(parts, "".join(b.text for b in blocks if b.kind == "reasoning"))
        parts = parts or [{"text": ""}]
        lp = None
        if self._logprobs and r.logprobs is not None:
            lp = _logprobs(list(zip(r.tokens or [""] * len(r.logprobs), r.logprobs)), r.top_logprobs)
        return self._answer(parts, self._finish(r), self._usage(r), lp)

    # ---- stream ----------------------------------------------------------------------
    def _frame(self, obj: dict) -> bytes:
        data = orjson.dumps(obj)
        if self.sse:
            return b"data: " + data + b"\r\n\r\n"
        head = b",\r\n" if self._sent else b"["
        self._sent = True
        return head + data

    def _reasoning(self) -> str:
        return "".join(b.text for b in self._blocks.blocks if b.kind == "reasoning")

    def _parts(self, events: list[Event]) -> list[dict]:
        parts = []
        for e in events:
            if e.op == "piece" and e.block.kind != "tool":
                parts.append({"text": e.piece, "thought": True} if e.block.kind == "reasoning" else {"text": e.piece})
            elif e.op == "close" and e.block.kind == "tool":
                parts.append(_part(e.block))
        if not self._signed:  # once thoughts give way to text or a call, their reasoning is whole
            self._signed = _sign_first(parts, self._reasoning())
        return parts

    def _chunk_logprobs(self, deltas: list[Delta]) -> dict | None:
        if not self._logprobs:
            return None
        tokens = [t for d in deltas for t in d.logprobs or ()]
        top = [alts for d in deltas for alts in d.top_logprobs or ()]
        return _logprobs(tokens, top) if tokens else None

    def chunks(self, deltas: list[Delta]) -> bytes:
        parts = self._parts(self._blocks.feed(deltas))
        lp = self._chunk_logprobs(deltas)
        return self._frame(self._answer(parts, logprobs=lp)) if parts or lp else b""

    def close(self, result: Result) -> bytes:
        parts = self._parts(self._blocks.finish()) or [{"text": ""}]
        out = self._frame(self._answer(parts, self._finish(result), self._usage(result)))
        return out if self.sse else out + b"]"

    def error(self, err: ProxyError) -> bytes:
        if self.sse:
            return b"data: " + error_body(err) + b"\r\n\r\n"
        head = b",\r\n" if self._sent else b"["
        self._sent = True
        return head + error_body(err) + b"]"


# the Gemini surface: served by `surfaces.gemini.endpoints` (the path names the model and the
# method), not at /v1/{path}; `path` names it for --strict-tools (`surfaces.hosted_tools.strict`)
GEMINI = Adapter("v1beta/models", to_request, GeminiWire, error=error_response, surface="gemini")
