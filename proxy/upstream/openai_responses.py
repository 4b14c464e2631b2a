"""An OpenAI Responses upstream (`--upstream-dialect openai-responses`): a hosted teacher model
that speaks `POST /v1/responses`.

The internal chat request becomes Responses input items — system and developer messages as
`instructions`, user and assistant text as `message` items, assistant `tool_calls` as
`function_call` items and tool messages as `function_call_output` items — with `store: false`
(the proxy keeps the record). The answer's output items come back as the chat `Result`.
Like the Anthropic dialect these calls are text only (`prompt_path = text-only`): no token ids.
"""

from __future__ import annotations

from typing import Any

from harnessrl.messages import content_text
from harnessrl.proxy.errors import ProxyError, UpstreamMalformed, bad_request
from harnessrl.proxy.protocol import Delta, Result, usage
from harnessrl.proxy.routes.text import Dialect, read_event
from harnessrl.proxy.upstream.vllm_wire import upstream_error


def to_responses_request(body: dict) -> dict:
    """The Responses body for an internal chat body."""
    instructions: list[str] = []
    items: list[dict] = []
    for i, m in enumerate(body["messages"]):
        role, content = m["role"], m.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") not in (None, "text")
                                             for p in content):
            raise bad_request(f"messages[{i}].content: the openai-responses upstream dialect takes text parts only",
                              param=f"messages[{i}].content", code="unsupported_content")
        text = content_text(content)
        if role in ("system", "developer"):
            instructions.append(text)
        elif role == "user":
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
        elif role == "assistant":
            if text:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": text}]})
            for c in m.get("tool_calls") or []:
                fn = c.get("function") or {}
                items.append({"type": "function_call", "call_id": c.get("id") or "", "name": fn.get("name") or "",
                              "arguments": fn.get("arguments") or "{}"})
        else:
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id") or "", "output": text})
    out: dict[str, Any] = {"model": body.get("model"), "input": items, "store": False}
    if instructions:
        out["instructions"] = "\n\n".join(s for s in instructions if s)
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if limit:
        out["max_output_tokens"] = limit
    for name in ("temperature", "top_p", "parallel_tool_calls", "stream"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("tools"):
        out["tools"] = [{"type": "function", "name": t["function"]["name"],
                         "description": t["function"].get("description") or "",
                         "parameters": t["function"].get("parameters") or {"type": "object", "properties": {}}}
                        for t in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        out["tool_choice"] = {"type": "function", "name": (choice.get("function") or {}).get("name")}
    elif choice is not None:
        out["tool_choice"] = choice
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        out["text"] = {"format": {"type": "json_schema", **(fmt.get("json_schema") or {})}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["text"] = {"format": {"type": "json_object"}}
    return out


def from_response(data: dict) -> Result:
    """The chat `Result` of a Responses `response` object."""
    if data.get("object") != "response" or not isinstance(data.get("output"), list):
        raise UpstreamMalformed(f"expected a Responses response object, got {str(data)[:200]}")
    if data.get("status") == "failed":
        err = data.get("error") or {}
        raise ProxyError(502, f"upstream: {err.get('message')}", "upstream_error", code=err.get("code") or "upstream_error")
    if data.get("status") not in ("completed", "incomplete"):  # cancelled, queued, in_progress: never finished
        raise ProxyError(502, f"the upstream's response has status {data.get('status')!r}, not completed "
                              "(a truncated answer)", "upstream_error", code="upstream_truncated")
    text, reasoning, calls = [], [], []
    for item in data["output"]:
        kind = item.get("type")
        if kind == "message":
            text.extend(p.get("text") or "" for p in item.get("content") or [] if p.get("type") == "output_text")
        elif kind == "reasoning":
            reasoning.extend(p.get("text") or "" for p in (item.get("summary") or []) + (item.get("content") or []))
        elif kind == "function_call":
            calls.append({"id": item.get("call_id") or item.get("id"), "type": "function",
                          "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    incomplete = (data.get("incomplete_details") or {}).get("reason")
    finish = {"max_output_tokens": "length", "content_filter": "content_filter"}.get(incomplete) or (
        "tool_calls" if calls else "stop")
    u = data.get("usage") or {}
    return Result(text=message["content"], finish_reason=finish, message=message,
                  usage=usage(int(u.get("input_tokens") or 0), int(u.get("output_tokens") or 0)))


class _Assembler:
    """Responses stream events → chat deltas; the final `response.completed` object is the result."""

    def __init__(self) -> None:
        self.final: dict | None = None
        self.started = False
        self.tool_index: dict[int, int] = {}  # output index → OpenAI tool-call index

    def feed(self, payload: bytes) -> Delta | None:
        kind, ev = read_event(payload)
        try:
            return self._event(kind, ev)
        except (KeyError, TypeError) as exc:
            raise UpstreamMalformed(f"stream event {payload[:200]!r}: missing {exc}") from None

    def _event(self, kind: str, ev: dict) -> Delta | None:
        if kind == "error":
            raise ProxyError(502, f"upstream: {ev.get('message')}", "upstream_error", code=ev.get("code"))
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            self.final = ev["response"]
        elif kind == "response.created" and not self.started:
            self.started = True
            return Delta(role="assistant")
        elif kind == "response.output_text.delta":
            return Delta(content=ev["delta"])
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return Delta(reasoning=ev["delta"])
        elif kind == "response.output_item.added" and ev["item"].get("type") == "function_call":
            item = ev["item"]
            n = self.tool_index[ev["output_index"]] = len(self.tool_index)
            return Delta(tool_calls=[{"index": n, "id": item.get("call_id"), "type": "function",
                                      "function": {"name": item.get("name"), "arguments": ""}}])
        elif kind == "response.function_call_arguments.delta":
            return Delta(tool_calls=[{"index": self.tool_index[ev["output_index"]],
                                      "function": {"arguments": ev["delta"]}}])
        return None

    def finish(self) -> Result:
        if self.final is None:
            raise UpstreamMalformed("the stream ended without response.completed")
        return from_response(self.final)


RESPONSES_DIALECT = Dialect("openai-responses", "/v1/responses", lambda body, _max_tokens: to_responses_request(body),
                            from_response, _Assembler, upstream_error)
