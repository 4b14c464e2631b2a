"""An Anthropic Messages upstream (`--upstream-dialect anthropic`): a hosted teacher model.

The internal chat request is translated to a Messages request — system messages to the top-level
`system`, assistant `tool_calls` to `tool_use` blocks, tool messages to `tool_result` blocks in a
user turn (consecutive turns of one role merged, as the API wants them), tools to
`input_schema`, `tool_choice` to auto/any/tool/none — and the answer back to the chat `Result`.

Anthropic returns no token ids and no log-probs, so these calls are recorded as text with
`prompt_path = text-only`: the compiler never makes RL samples of them, and they serve as expert
traces (`harnessrl traces from-rollouts`). The pool sends the key as `x-api-key` with
`anthropic-version` (`upstream.http_pool.credential_headers`).
"""

from __future__ import annotations

from typing import Any

import orjson

from harnessrl.messages import content_text
from harnessrl.proxy.errors import ProxyError, UpstreamMalformed, bad_request
from harnessrl.proxy.protocol import Delta, Result, usage
from harnessrl.proxy.routes.text import Dialect, read_event

_STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
         "pause_turn": "stop", "refusal": "content_filter"}


def _text_blocks(content: Any, where: str) -> list[dict]:
    if isinstance(content, list):
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") not in (None, "text"):
                raise bad_request(f"{where}.content[{j}]: the anthropic upstream dialect takes text parts only",
                                  param=f"{where}.content[{j}]", code="unsupported_content")
    text = content_text(content)
    return [{"type": "text", "text": text}] if text else []


def _tool_use(call: dict) -> dict:
    fn = call.get("function") or {}
    try:
        args = orjson.loads(fn.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        args = {"_raw": fn.get("arguments")}  # the model's own malformed arguments, kept as sent
    return {"type": "tool_use", "id": call.get("id") or "", "name": fn.get("name") or "",
            "input": args if isinstance(args, dict) else {"_value": args}}


def to_messages_request(body: dict, default_max_tokens: int) -> dict:
    """The Anthropic Messages body for an internal chat body."""
    system: list[str] = []
    turns: list[dict] = []

    def add(role: str, blocks: list[dict]) -> None:
        if not blocks:
            return
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for i, m in enumerate(body["messages"]):
        role = m["role"]
        if role in ("system", "developer"):
            system.append(content_text(m.get("content")))
        elif role == "user":
            add("user", _text_blocks(m.get("content"), f"messages[{i}]"))
        elif role == "assistant":
            add("assistant", _text_blocks(m.get("content"), f"messages[{i}]")
                + [_tool_use(c) for c in m.get("tool_calls") or []])
        else:  # tool / function results
            add("user", [{"type": "tool_result", "tool_use_id": m.get("tool_call_id") or m.get("name") or "",
                          "content": content_text(m.get("content"))}])
    out: dict[str, Any] = {"model": body.get("model"), "messages": turns,
                           "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens")
                           or default_max_tokens}
    if system:
        out["system"] = "\n\n".join(s for s in system if s)
    for name in ("temperature", "top_p", "stream"):
        if body.get(name) is not None:
            out[name] = body[name]
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("tools"):
        out["tools"] = [{"name": t["function"]["name"], "description": t["function"].get("description") or "",
                         "input_schema": t["function"].get("parameters") or {"type": "object", "properties": {}}}
                        for t in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        out["tool_choice"] = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    elif choice in ("auto", "required", "none"):
        out["tool_choice"] = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
    return out


def _tool_call(block: dict) -> dict:
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": orjson.dumps(block.get("input") or {}).decode()}}


def from_message(data: dict) -> Result:
    """The chat `Result` of an Anthropic `message` object."""
    if data.get("type") != "message" or not isinstance(data.get("content"), list):
        raise UpstreamMalformed(f"expected an Anthropic message object, got {str(data)[:200]}")
    if not data.get("stop_reason"):  # a stream cut before its message_delta, or a message never finished
        raise ProxyError(502, "the upstream's message has no stop_reason (a truncated answer)", "upstream_error",
                         code="upstream_truncated")
    text, reasoning, calls = [], [], []
    for block in data["content"]:
        kind = block.get("type")
        if kind == "text":
            text.append(block.get("text") or "")
        elif kind == "thinking":
            reasoning.append(block.get("thinking") or "")
        elif kind == "tool_use":
            calls.append(_tool_call(block))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    u = data.get("usage") or {}
    return Result(text=message["content"], finish_reason=_STOP.get(data.get("stop_reason"), "stop"),
                  usage=usage(int(u.get("input_tokens") or 0), int(u.get("output_tokens") or 0)), message=message)


def anthropic_error(status: int, body: bytes) -> ProxyError:
    """The upstream's own Anthropic error, as an OpenAI-shaped one for the harness."""
    try:
        err = orjson.loads(body)["error"]
        return ProxyError(status if status >= 400 else 502, f"upstream: {err.get('message')}",
                          str(err.get("type") or "upstream_error"), code="upstream_error")
    except Exception:  # noqa: BLE001 - not an Anthropic error body
        text = body[:500].decode("utf-8", "replace")
        return ProxyError(status if status >= 400 else 502, f"upstream returned HTTP {status}: {text}",
                          "upstream_error", code="upstream_error")


class _Assembler:
    """Anthropic stream events → chat deltas, and the whole message at the end."""

    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self.blocks: dict[int, dict] = {}
        self.partial_json: dict[int, list[str]] = {}
        self.tool_index: dict[int, int] = {}  # block index → OpenAI tool-call index

    def feed(self, payload: bytes) -> Delta | None:
        kind, ev = read_event(payload)
        if kind == "error":
            err = ev.get("error") or {}
            raise ProxyError(502, f"upstream: {err.get('message')}", str(err.get("type") or "upstream_error"),
                             code="upstream_error")
        if kind == "message_start":
            self.message = {**ev["message"], "content": []}
            return Delta(role="assistant")
        if self.message is None:
            if kind == "ping":
                return None
            raise UpstreamMalformed(f"stream event {kind!r} before message_start")
        try:
            return self._content(kind, ev)
        except (KeyError, TypeError) as exc:
            raise UpstreamMalformed(f"stream event {payload[:200]!r}: missing {exc}") from None

    def _content(self, kind: str, ev: dict) -> Delta | None:
        assert self.message is not None
        if kind == "content_block_start":
            i, block = ev["index"], dict(ev["content_block"])
            self.blocks[i] = block
            if block.get("type") == "tool_use":
                n = self.tool_index[i] = len(self.tool_index)
                self.partial_json[i] = []
                return Delta(tool_calls=[{"index": n, "id": block["id"], "type": "function",
                                          "function": {"name": block["name"], "arguments": ""}}])
        elif kind == "content_block_delta":
            i, d = ev["index"], ev["delta"]
            block = self.blocks[i]
            if d.get("type") == "text_delta":
                block["text"] = block.get("text", "") + d["text"]
                return Delta(content=d["text"])
            if d.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + d["thinking"]
                return Delta(reasoning=d["thinking"])
            if d.get("type") == "input_json_delta":
                self.partial_json[i].append(d.get("partial_json") or "")
                return Delta(tool_calls=[{"index": self.tool_index[i],
                                          "function": {"arguments": d.get("partial_json") or ""}}])
        elif kind == "content_block_stop":
            i = ev["index"]
            if i in self.partial_json:
                raw = "".join(self.partial_json[i])
                try:
                    self.blocks[i]["input"] = orjson.loads(raw) if raw else {}
                except orjson.JSONDecodeError as exc:
                    raise UpstreamMalformed(f"tool_use input {raw[:200]!r}: {exc}") from None
        elif kind == "message_delta":
            self.message.update({k: v for k, v in (ev.get("delta") or {}).items() if v is not None})
            self.message["usage"] = {**(self.message.get("usage") or {}), **(ev.get("usage") or {})}
        return None

    def finish(self) -> Result:
        if self.message is None:
            raise UpstreamMalformed("the stream ended before message_start")
        self.message["content"] = [self.blocks[i] for i in sorted(self.blocks)]
        return from_message(self.message)


ANTHROPIC_DIALECT = Dialect("anthropic", "/v1/messages", to_messages_request, from_message, _Assembler, anthropic_error)
