"""The vLLM wire format: what the proxy adds to a request, reads from a response, and strips
before the harness sees it.

vLLM (>= 0.10.2) returns token ids with `return_token_ids: true`: `prompt_token_ids` at the top
of a chat response (per choice for /v1/completions), `choices[].token_ids` for the completion;
in streams `prompt_token_ids` comes on the first chunk and each chunk's `token_ids` holds its
delta. Sampling log-probs come from `logprobs` (chat: `choices[].logprobs.content[].logprob`;
completions: `choices[].logprobs.token_logprobs`). With `return_weight_versions: true` each
choice carries `weight_versions: [{version, start, end}]` (streams: on its terminal chunk).
"""

from __future__ import annotations

import struct
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import orjson

from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.protocol import Delta


@dataclass
class Wants:
    """What the harness asked for itself (everything else the proxy added is stripped)."""

    logprobs: bool
    usage_chunk: bool
    reasoning: bool
    token_ids: bool = False  # `return_token_ids`: the harness gets vLLM's id fields too


def prepare(req: dict, chat: bool) -> tuple[bytes, Wants]:
    body = dict(req)
    if chat:
        wants = Wants(bool(req.get("logprobs")), _include_usage(req), req.get("include_reasoning", True) is not False)
        body["logprobs"] = True
        body.setdefault("top_logprobs", 0)
        body["include_reasoning"] = True
    else:
        wants = Wants(req.get("logprobs") is not None, _include_usage(req), True)
        if req.get("logprobs") is None:
            body["logprobs"] = 0
    wants.token_ids = bool(req.get("return_token_ids"))
    body["return_token_ids"] = True
    body["return_weight_versions"] = True
    if req.get("stream"):
        body["stream_options"] = {**(req.get("stream_options") or {}), "include_usage": True}
    return orjson.dumps(body), wants


def upstream_error(status: int, body: bytes) -> ProxyError:
    """The upstream's own OpenAI error when it sent one, else a wrapped one."""
    try:
        err = orjson.loads(body)["error"]
        return ProxyError(status, str(err.get("message")), str(err.get("type") or "upstream_error"),
                          err.get("param"), err.get("code"))
    except Exception:  # noqa: BLE001 - not an OpenAI error body
        text = body[:500].decode("utf-8", "replace")
        return ProxyError(status if status >= 400 else 502, f"upstream returned HTTP {status}: {text}",
                          "upstream_error")


def error_in(obj: Any) -> ProxyError | None:
    """The upstream's error when a JSON object it sent with status 200 is one: vLLM's streaming
    error event `{"error": {...}}` (older vLLM: a flat `{"object": "error", ...}`), or such an
    object as a whole body. The harness and the record get the upstream's words."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error") if isinstance(obj.get("error"), dict) else obj if obj.get("object") == "error" else None
    if err is None:
        return None
    kind, code = err.get("type"), err.get("code")
    said = ", ".join(str(x) for x in (kind, code) if x is not None)
    return ProxyError(502, f"the upstream sent an error: {err.get('message')}" + (f" ({said})" if said else ""),
                      "upstream_error", code="upstream_error")


def body_error(rest: bytes | bytearray) -> ProxyError | None:
    """The upstream's error when a stream's body was not SSE but one JSON error object (an error
    answered with status 200, as overloaded gateways do)."""
    try:
        return error_in(orjson.loads(rest))
    except orjson.JSONDecodeError:
        return None


# finish reasons of answers that did not finish: vLLM's FinishReason.ABORT and .ERROR
UNFINISHED = frozenset(("abort", "error"))


def unfinished(finish_reason: str | None, where: str) -> ProxyError | None:
    """The error for an answer that does not say it finished (None when it does)."""
    if not finish_reason:
        return truncated(f"the upstream's {where} has no finish_reason")
    if finish_reason in UNFINISHED:
        return truncated(f"the upstream's {where} ended with finish_reason {finish_reason!r}")
    return None


def truncated(what: str) -> ProxyError:
    """An answer that ended without saying it was complete: never recorded as a finished one."""
    return ProxyError(502, f"{what} (a truncated answer)", "upstream_error", code="upstream_truncated")


def _include_usage(req: dict) -> bool:
    opts = req.get("stream_options")
    return bool(isinstance(opts, dict) and opts.get("include_usage"))


def weight_version_of(spans: Any) -> str | None:
    if not isinstance(spans, list) or not spans:
        return None
    seen: list[str] = []
    for s in spans:
        v = str(s.get("version")) if isinstance(s, dict) else str(s)
        if v not in seen:
            seen.append(v)
    return ",".join(seen)


@dataclass
class Extract:
    """What a call record needs from an upstream response."""

    prompt_ids: list[int] | array | None = None  # int32 arrays once `checked`
    completion_ids: list[int] | array | None = None
    logprobs: list[float] | None = None
    weight_version: str | None = None
    usage: dict | None = None
    finish_reason: str | None = None
    text: str | None = None
    tool_calls: list | None = None
    reply: dict | None = None  # chat: the assistant message


def _token_logprobs(choice: dict, chat: bool) -> list[float] | None:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if chat:
        content = lp.get("content")
        return None if content is None else [c["logprob"] for c in content]
    return lp.get("token_logprobs")


def extract_and_strip(resp: dict, wants: Wants, chat: bool) -> Extract:
    """Read the RL fields of a full (non-stream) response and remove what the harness did not ask for."""
    if (err := error_in(resp)) is not None:
        raise err
    ex = Extract(usage=resp.get("usage"))
    choices = resp.get("choices")
    if not isinstance(choices, list) or not choices:  # an error the upstream sent as a 200
        raise ValueError(f"the response has no choices: {orjson.dumps(resp)[:300]!r}")
    if chat:
        ex.prompt_ids = resp.get("prompt_token_ids") if wants.token_ids else resp.pop("prompt_token_ids", None)
    for i, ch in enumerate(choices):
        if i == 0:
            if not chat:
                ex.prompt_ids = ch.get("prompt_token_ids")
            ex.completion_ids = ch.get("token_ids")
            ex.logprobs = _token_logprobs(ch, chat)
            ex.weight_version = weight_version_of(ch.get("weight_versions"))
            ex.finish_reason = ch.get("finish_reason")
            if chat:
                msg = ch.get("message") or {}
                ex.reply = msg
                ex.text = msg.get("content")
                ex.tool_calls = msg.get("tool_calls") or None
            else:
                ex.text = ch.get("text")
        _strip_choice(ch, wants, chat, "message")
    if (err := unfinished(ex.finish_reason, "response")) is not None:
        raise err
    return checked(ex)


def checked(ex: Extract) -> Extract:
    """`ex`, once its ids, log-probs and usage have the types the records need (ValueError if not).
    Its token ids become int32 arrays: the check builds them anyway, and the record and the prefix
    index then take them as they are (converting a list of ints costs ~7 ns an id, each time)."""
    try:  # struct.pack and array() check every element in C: ints in int32 range, numbers
        if ex.prompt_ids is not None:
            ex.prompt_ids = _int32(ex.prompt_ids)
        if ex.completion_ids is not None:
            ex.completion_ids = _int32(ex.completion_ids)
        if ex.logprobs is not None:  # checked only: the harness may see them, at full precision
            if not isinstance(ex.logprobs, list):
                raise TypeError
            array("f", ex.logprobs)
    except (TypeError, ValueError, OverflowError, struct.error):
        raise ValueError("token ids must be lists of int32 and log-probs lists of numbers") from None
    if ex.usage is not None and not (isinstance(ex.usage, dict) and all(
            isinstance(ex.usage.get(k, 0), int) for k in ("prompt_tokens", "completion_tokens"))):
        raise ValueError(f"usage must be an object of token counts, got {ex.usage!r:.200}")
    return ex


def _int32(values: Any) -> array:
    """`values` as an int32 array; struct.error unless every one is an int in int32 range.
    `struct.pack` converts ~3x faster than `array("i", values)` (5 µs for a 700-id prompt)."""
    if not isinstance(values, list):
        raise TypeError
    out = array("i")
    out.frombytes(struct.pack(f"={len(values)}i", *values))
    return out


def _strip_choice(ch: dict, wants: Wants, chat: bool, msg_key: str) -> None:
    if not wants.token_ids:
        ch.pop("token_ids", None)
        ch.pop("prompt_token_ids", None)
    ch.pop("weight_versions", None)
    if not wants.logprobs:
        ch["logprobs"] = None
    if chat and not wants.reasoning:
        msg = ch.get(msg_key)
        if isinstance(msg, dict):
            msg.pop("reasoning", None)
            msg.pop("reasoning_content", None)


@dataclass
class StreamAssembler:
    """Collects ids, log-probs and the message from stream chunks; strips each chunk."""

    wants: Wants
    chat: bool
    ex: Extract = field(default_factory=Extract)
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tools: dict[int, dict] = field(default_factory=dict)
    head: dict = field(default_factory=dict)
    answered: bool = False  # a chunk with a choice came

    def __post_init__(self) -> None:
        self.ex.completion_ids = []
        self.ex.logprobs = []

    def feed(self, chunk: dict) -> Delta | None:
        """Record one chunk; returns its delta for the harness (the stripped chunk as `raw`), or
        None to drop it. Chunks from the one that finishes on are terminal; an error chunk raises
        (a stream cut short by the upstream is a failed call, never a shorter answer)."""
        if (err := error_in(chunk)) is not None:
            raise err
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model")}
        if self.chat and "prompt_token_ids" in chunk:
            ids = chunk.get("prompt_token_ids") if self.wants.token_ids else chunk.pop("prompt_token_ids")
            if ids is not None:
                self.ex.prompt_ids = ids
        if chunk.get("usage"):
            self.ex.usage = chunk["usage"]
            if not self.wants.usage_chunk:
                chunk.pop("usage")
        choices = chunk.get("choices") or []
        self.answered = self.answered or bool(choices)
        out = Delta(raw=chunk, usage=chunk.get("usage"), terminal=not choices)
        for ch in choices:
            if ch.get("index", 0) == 0:
                self._feed_choice(ch, out)
            if ch.get("finish_reason"):
                out.terminal = True
            _strip_choice(ch, self.wants, self.chat, "delta")
        if not choices and not self.wants.usage_chunk:
            return None  # the usage-only chunk the proxy asked for
        return out

    def _feed_choice(self, ch: dict, out: Delta) -> None:
        ex = self.ex
        if not self.chat and ch.get("prompt_token_ids") is not None:
            ex.prompt_ids = ch["prompt_token_ids"]
        if ch.get("token_ids"):
            ex.completion_ids.extend(ch["token_ids"])  # type: ignore[union-attr]
        lps = _token_logprobs(ch, self.chat)
        if lps:
            ex.logprobs.extend(lps)  # type: ignore[union-attr]
        if ch.get("weight_versions") is not None:
            ex.weight_version = weight_version_of(ch["weight_versions"])
        if ch.get("finish_reason"):
            ex.finish_reason = out.finish_reason = ch["finish_reason"]
        if not self.chat:
            if ch.get("text"):
                self.content.append(ch["text"])
                out.content = ch["text"]
            return
        delta = ch.get("delta") or {}
        out.role = delta.get("role")
        if delta.get("content"):
            self.content.append(delta["content"])
            out.content = delta["content"]
        r = delta.get("reasoning") or delta.get("reasoning_content")
        if r:
            self.reasoning.append(r)
            out.reasoning = r
        out.tool_calls = delta.get("tool_calls") or None
        for tc in delta.get("tool_calls") or []:
            slot = self.tools.setdefault(tc.get("index", 0), {"id": None, "type": "function",
                                                                "function": {"name": "", "arguments": ""}})
            if tc.get("id"):
                slot["id"] = tc["id"]
            fn = tc.get("function") or {}
            if fn.get("name"):
                slot["function"]["name"] += fn["name"]
            if fn.get("arguments"):
                slot["function"]["arguments"] += fn["arguments"]

    def finish(self) -> tuple[Extract, dict]:
        """The extract and the reassembled full response (what a non-stream call would return)."""
        if not self.answered:
            raise ValueError("the stream ended without a choice")
        ex = self.ex
        if (err := unfinished(ex.finish_reason, "stream")) is not None:
            raise err
        text = "".join(self.content)
        choice: dict[str, Any] = {"index": 0, "finish_reason": ex.finish_reason, "logprobs": None}
        if self.chat:
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            if self.reasoning:
                msg["reasoning"] = "".join(self.reasoning)
            calls = [self.tools[i] for i in sorted(self.tools)]
            if calls:
                msg["tool_calls"] = calls
            choice["message"] = msg
            ex.reply, ex.text, ex.tool_calls = msg, msg["content"], calls or None
        else:
            choice["text"] = text
            ex.text = text
        resp = {**self.head, "object": "chat.completion" if self.chat else "text_completion",
                "choices": [choice], "usage": ex.usage}
        if resp.get("created") is None:
            resp["created"] = int(time.time())
        return checked(ex), resp


def sse_events(buffer: bytearray, data: bytes) -> list[bytes]:
    """Append `data` and pop every complete SSE event's data payload (the lines after `data:`,
    joined). The complete events are cut off the buffer at once: a read holds many of them."""
    buffer += data.replace(b"\r\n", b"\n")
    if b"\n\n" not in buffer:
        return []
    *events, rest = bytes(buffer).split(b"\n\n")
    buffer[:] = rest
    out = []
    for event in events:
        if b"\n" not in event:  # vLLM's: one `data:` line an event
            payload = event[5:].lstrip() if event.startswith(b"data:") else b""
        else:
            payload = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
        if payload:
            out.append(payload)
    return out
