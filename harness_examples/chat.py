"""What the OpenAI-SDK harnesses share: one chat call that also returns the proxy's call id,
tolerant parsing of the model's tool calls (a random or young policy emits unknown tools and
broken JSON; those become error messages back to the model, never exceptions), and the
per-rollout result the loop aggregates."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import openai

from harnessrl.client import HarnessRL

CALL_ID_HEADER = "x-harnessrl-call"


@dataclass
class ToolCall:
    id: str
    name: str
    raw_arguments: str
    arguments: dict[str, Any] | None  # None when `raw_arguments` is not a JSON object
    error: str | None = None


@dataclass
class Turn:
    """One assistant reply: the message to append to the history, its tool calls, the proxy call id."""

    message: dict[str, Any]
    content: str
    tool_calls: list[ToolCall]
    call_id: str | None
    finish_reason: str | None


@dataclass
class RolloutResult:
    rollout_id: str
    task_id: str
    outcome: float
    answer: str = ""
    metrics: dict[str, float] = field(default_factory=dict)  # success, tool_calls, tool_errors, model_calls, ...
    error: str | None = None  # why the episode stopped early (e.g. the prompt outgrew the context)


class EpisodeStopped(Exception):
    """The server refused a call a rollout can cause (context length, bad request): end the episode."""


@contextmanager
def harnessrl_client(hrl: HarnessRL | str) -> Iterator[HarnessRL]:
    """The given client, or one for the given proxy URL that is closed afterwards."""
    if isinstance(hrl, HarnessRL):
        yield hrl
        return
    client = HarnessRL(hrl)
    try:
        yield client
    finally:
        client.close()


def make_client(base_url: str, api_key: str, headers: dict[str, str] | None = None) -> openai.OpenAI:
    # No retries: a retried call would be recorded twice by the proxy.
    return openai.OpenAI(base_url=base_url, api_key=api_key, default_headers=headers or {}, max_retries=0,
                         timeout=600.0)


def _parse_tool_call(tc: Any) -> ToolCall:
    raw = tc.function.arguments or ""
    try:
        args = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        return ToolCall(tc.id, tc.function.name or "", raw, None, f"arguments are not valid JSON ({exc.msg})")
    if not isinstance(args, dict):
        return ToolCall(tc.id, tc.function.name or "", raw, None, "arguments must be a JSON object")
    return ToolCall(tc.id, tc.function.name or "", raw, args)


def chat(client: openai.OpenAI, model: str, messages: list[dict], tools: list[dict] | None, *,
         max_tokens: int, temperature: float) -> Turn:
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=messages, tools=tools or openai.NOT_GIVEN, max_tokens=max_tokens,
            temperature=temperature)
    except openai.BadRequestError as exc:
        raise EpisodeStopped(str(exc)) from None
    completion = raw.parse()
    choice = completion.choices[0]
    msg = choice.message
    calls = [_parse_tool_call(tc) for tc in (msg.tool_calls or []) if getattr(tc, "function", None)]
    message: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
    reasoning = (msg.model_extra or {}).get("reasoning_content")
    if reasoning:
        # Echo the reasoning back so the next prompt extends this one token for token.
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.raw_arguments}}
                                 for c in calls]
    return Turn(message, msg.content or "", calls, raw.headers.get(CALL_ID_HEADER), choice.finish_reason)


def run_tool(call: ToolCall, tools: dict[str, Callable[..., str]]) -> tuple[str, bool]:
    """Execute a parsed tool call; (result text, ok). Every failure is reported as text to the model."""
    if call.error:
        return f"Error: {call.error}.", False
    fn = tools.get(call.name)
    if fn is None:
        return f"Error: unknown tool {call.name!r}; available: {', '.join(sorted(tools))}.", False
    try:
        return str(fn(**call.arguments)), True
    except TypeError as exc:
        return f"Error: bad arguments for {call.name}: {exc}.", False
    except (ValueError, ArithmeticError, OverflowError) as exc:
        return f"Error: {exc}.", False


def tool_message(call: ToolCall, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "content": content}


def resolve_model(client: openai.OpenAI, model: str | None) -> str:
    """The model name to send: the given one, else the first the server lists (the proxy lists the
    model it serves, which is what the compiler later reads back to find the tokenizer)."""
    if model:
        return model
    listed = client.models.list().data
    return listed[0].id if listed else "default"


def tool_loop(client: openai.OpenAI, model: str | None, messages: list[dict], schemas: list[dict],
              tools: dict[str, Callable[..., str]], *, max_turns: int, max_tokens: int,
              temperature: float, answer_from_tool: bool = False) -> tuple[str, str | None, dict[str, int]]:
    """One agent: chat until a reply makes no tool call (its answer) or `max_turns` replies;
    tool calls run locally and their results go back as tool messages. `messages` grows in
    place. Returns (answer, why the episode stopped early or None, counts).

    `answer_from_tool`: the first tool call that runs successfully ends the episode and its
    result is the answer (its tool message is still appended), so success measures choosing the
    tool and its arguments, not copying the result into a final reply."""
    from harnessrl.harness_examples.text_metrics import extract_answer

    counts = {"model_calls": 0, "tool_calls": 0, "tool_errors": 0}
    try:
        model = resolve_model(client, model)
        for _ in range(max_turns):
            counts["model_calls"] += 1
            turn = chat(client, model, messages, schemas, max_tokens=max_tokens, temperature=temperature)
            messages.append(turn.message)
            if not turn.tool_calls:
                return extract_answer(turn.content), None, counts
            for call in turn.tool_calls:
                result, ok = run_tool(call, tools)
                counts["tool_calls"] += 1
                counts["tool_errors"] += not ok
                messages.append(tool_message(call, result))
                if answer_from_tool and ok:
                    return result, None, counts
    except EpisodeStopped as exc:
        return "", str(exc), counts
    return "", None, counts
