"""Token route: the proxy builds the prompt ids itself — prefix-consistent when the call
extends an earlier one (`prefix.Prompter`) — and has a `TokenBackend` (the embedded local
backend, or an upstream's /v1/completions driven by token ids) sample the completion; the
assistant message is parsed from the text (hermes `<tool_call>` blocks)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from harnessrl.proxy.backend import Completion, SamplingParams, TokenBackend, TokenDelta
from harnessrl.proxy.errors import BackendRejected, ProxyError
from harnessrl.proxy.prefix import Prompter, Turn
from harnessrl.proxy.protocol import Delta, Prompt, Request, Result, usage
from harnessrl.proxy.toolparse import parse_hermes, streamable_prefix


def sampling(body: dict, default_max_tokens: int) -> SamplingParams:
    stop = body.get("stop") or []
    return SamplingParams(
        max_tokens=body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens,
        temperature=1.0 if body.get("temperature") is None else float(body["temperature"]),
        top_p=1.0 if body.get("top_p") is None else float(body["top_p"]),
        seed=body.get("seed"),
        stop=[stop] if isinstance(stop, str) else list(stop),
    )


class TokenRoute:
    def __init__(self, backend: TokenBackend, prompter: Prompter, model_name: str, default_max_tokens: int) -> None:
        self.backend = backend
        self.prompter = prompter
        self.tok = backend.tokenizer
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        self.eos_ids: frozenset[int] = frozenset(
            getattr(backend, "eos_token_ids", None) or [self.tok.eos_token_id])

    def prompt(self, req: Request, turn: Turn | None) -> Prompt:
        if not req.chat:
            p = req.body["prompt"]
            if isinstance(p, list) and isinstance(p[0], str):
                p = p[0]
            return Prompt("raw", ids=self.tok.encode(p) if isinstance(p, str) else p)
        try:
            plan = self.prompter.plan(req.messages, req.tools, turn)
        except ProxyError:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. a template that rejects the messages
            raise BackendRejected(f"cannot render the messages with the chat template: {exc}", param="messages",
                                  code="template_error") from None
        return Prompt(plan.path, plan.prefix_call_id, plan.drift, plan.ids, turn)

    async def run(self, req: Request, prompt: Prompt) -> Result:
        comp = await self.backend.generate(prompt.ids, sampling(req.body, self.default_max_tokens))
        tokens = [self.tok.decode([t]) for t in comp.completion_ids] if req.logprobs else None
        return self._result(req, comp, tokens)

    async def stream(self, req: Request, prompt: Prompt) -> AsyncIterator[list[Delta] | Result]:
        items = self.backend.stream(prompt.ids, sampling(req.body, self.default_max_tokens))
        try:  # closing this stream (the harness hung up) closes the backend's: generation stops
            async for out in self._deltas(req, prompt, items):
                yield out
        finally:
            await items.aclose()

    async def _deltas(self, req: Request, prompt: Prompt,
                      items: AsyncGenerator[TokenDelta | Completion, None]) -> AsyncIterator[list[Delta] | Result]:
        first = await anext(items)  # a rejected prompt fails here, before the 200
        progress = prompt.progress
        progress.prompt_ids = prompt.ids
        lead = [Delta(role="assistant", content="")] if req.chat else []
        tools = req.chat and self._tool_parsing(req)
        want_lp = req.chat and req.logprobs
        text, sent = "", 0
        comp: Completion | None = None
        item: TokenDelta | Completion | None = first
        while item is not None:
            if isinstance(item, Completion):
                comp = item
                break
            text += item.text
            progress.completion_ids.append(item.token_id)
            progress.logprobs.append(item.logprob)
            progress.text.append(item.text)
            upto = streamable_prefix(text) if tools else len(text)
            out = lead
            if upto > sent or want_lp:
                lp = [(item.text, item.logprob)] if want_lp else None
                out = [*lead, Delta(content=text[sent:upto], logprobs=lp)]
                sent = max(sent, upto)
            if out:
                yield out
            lead = []
            item = await anext(items, None)
        if comp is None:
            raise RuntimeError("the backend stream ended without a completion")
        result = self._result(req, comp, None)
        yield [*lead, *self._tail(req, result, text[:sent])]
        yield result

    def _tail(self, req: Request, r: Result, sent: str) -> list[Delta]:
        """The deltas after the last token: the rest of the content (a tool call's tags held back
        while streaming turned out to be text), the parsed tool calls, finish, usage."""
        tail = []
        content = r.text or ""
        if len(content) > len(sent) and content.startswith(sent):
            tail.append(Delta(content=content[len(sent):], terminal=True))
        if r.tool_calls:
            tail.append(Delta(tool_calls=[{"index": i, **c} for i, c in enumerate(r.tool_calls)], terminal=True))
        tail.append(Delta(finish_reason=r.finish_reason, terminal=True))
        if req.include_usage:
            tail.append(Delta(usage=r.usage, terminal=True))
        return tail

    def _tool_parsing(self, req: Request) -> bool:
        return bool(req.tools) and req.body.get("tool_choice") != "none"

    def _result(self, req: Request, comp: Completion, tokens: list[str] | None) -> Result:
        u = usage(len(comp.prompt_ids), len(comp.completion_ids))
        common: dict[str, Any] = dict(usage=u, prompt_ids=comp.prompt_ids, completion_ids=comp.completion_ids,
                                      logprobs=comp.logprobs, weight_version=comp.weight_version, tokens=tokens)
        if not req.chat:
            return Result(text=comp.text, finish_reason=comp.finish_reason, **common)
        content, calls = parse_hermes(comp.text) if self._tool_parsing(req) else (comp.text, [])
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        return Result(text=content, finish_reason="tool_calls" if calls else comp.finish_reason, message=msg,
                      **common)
