"""Token route: the proxy builds the prompt ids itself — prefix-consistent when the call
extends an earlier one (`prefix.prompts.Prompter`) — and has a `TokenBackend` (the embedded local
backend, or an upstream's /v1/completions driven by token ids) sample the completion; the
assistant message is parsed from the text (hermes `<tool_call>` blocks)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from harnessrl.proxy.routes.token_backend import Completion, SamplingParams, TokenBackend, TokenDelta
from harnessrl.proxy.local.constrained import Constrainer
from harnessrl.proxy.routes.chat_fields import check_text_only, developer_as_system, map_developer
from harnessrl.proxy.errors import BackendRejected, ProxyError, bad_request
from harnessrl.proxy.prefix.prompts import Prompter, Turn
from harnessrl.proxy.protocol import Delta, Prompt, Request, Result, usage
from harnessrl.proxy.routes.hermes_tools import parse_hermes, streamable_prefix
from harnessrl.tool_rendering import dropped_tools_message, template_renders_tools


PROMPT_THREADS = min(4, os.cpu_count() or 1)  # prompts rendered and tokenized at once
T = TypeVar("T")


def sampling(body: dict, default_max_tokens: int, top_logprobs: int = 0) -> SamplingParams:
    stop = body.get("stop") or []
    return SamplingParams(
        max_tokens=body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens,
        temperature=1.0 if body.get("temperature") is None else float(body["temperature"]),
        top_p=1.0 if body.get("top_p") is None else float(body["top_p"]),
        seed=body.get("seed"),
        stop=[stop] if isinstance(stop, str) else list(stop),
        top_logprobs=top_logprobs,
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
        self.model_path: str | None = getattr(backend, "model_path", None)
        self._developer_as_system = developer_as_system(self.tok.chat_template)
        self._renders_tools = template_renders_tools(self.tok)  # asked once: the template never changes
        # the local backend enforces response_format / tool_choice itself; an upstream is sent them
        self._local = hasattr(backend, "vocab_size")
        self._constrainer: Constrainer | None = None
        self._constrainer_lock = threading.Lock()
        # bounded: a burst of large bodies queues here instead of taking every core
        self._pool = ThreadPoolExecutor(max_workers=PROMPT_THREADS, thread_name_prefix="harnessrl-prompt")

    async def prompt(self, req: Request, turn: Turn | None) -> Prompt:
        # rendering and tokenizing a large body takes seconds (8 MB: ~9 s with a fast tokenizer),
        # all of it on the event loop before: every other call and /health waited (issue 30). The
        # tokenizers release the GIL while they encode, so the loop runs on meanwhile.
        return await self.off_loop(self._prompt, req, turn)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the route's prompt threads (count_tokens and embeddings tokenize there too)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _prompt(self, req: Request, turn: Turn | None) -> Prompt:
        if not req.chat:
            p = req.body["prompt"]
            if isinstance(p, list) and isinstance(p[0], str):
                p = p[0]
            ids = self.tok.encode(p) if isinstance(p, str) else p
            vocab = len(self.tok)
            if any(t >= vocab for t in ids):  # the model has no such token: the caller's mistake
                raise bad_request(f"'prompt' holds a token id outside the vocabulary (size {vocab})",
                                  param="prompt", code="invalid_value")
            return Prompt("raw", ids=ids)
        check_text_only(req.messages, self.model_name)
        if req.tools and not self._renders_tools:  # a prompt without them would be recorded as if asked
            raise bad_request(dropped_tools_message(self.model_name), param="tools", code="tools_not_rendered")
        self._grammar(req.body)  # a field it cannot enforce is a 400 before the model runs
        messages = map_developer(req.messages) if self._developer_as_system else req.messages
        try:
            plan = self.prompter.plan(messages, req.tools, turn)
        except ProxyError:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. a template that rejects the messages
            raise BackendRejected(f"cannot render the messages with the chat template: {exc}", param="messages",
                                  code="template_error") from None
        return Prompt(plan.path, plan.prefix_call_id, plan.drift, plan.ids, turn)

    def _grammar(self, body: dict):
        if not self._local or (body.get("response_format") is None
                               and body.get("tool_choice") in (None, "auto", "none")):
            return None
        with self._constrainer_lock:  # prompts are planned on several threads
            if self._constrainer is None:
                self._constrainer = Constrainer(self.tok, self.backend.vocab_size, self.eos_ids)  # type: ignore[attr-defined]
        return self._constrainer.compiled(body)

    def _params(self, req: Request) -> SamplingParams:
        params = sampling(req.body, self.default_max_tokens, req.top_logprobs)
        params.via = req.upstream
        if req.chat and self._local:
            compiled = self._grammar(req.body)
            if compiled is not None:
                params.constraint = self._constrainer.constraint(compiled)  # type: ignore[union-attr]
        elif req.chat and req.body.get("response_format") is not None:
            params.upstream_fields["response_format"] = req.body["response_format"]
        return params

    async def run(self, req: Request, prompt: Prompt) -> Result:
        comp = await self.backend.generate(prompt.ids, self._params(req))
        tokens = [self.tok.decode([t]) for t in comp.completion_ids] if req.logprobs else None
        return self._result(req, comp, tokens)

    async def stream(self, req: Request, prompt: Prompt) -> AsyncIterator[list[Delta] | Result]:
        items = self.backend.stream(prompt.ids, self._params(req))
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
        want_ids = req.token_ids
        lead = [Delta(role="assistant", content="", prompt_ids=prompt.ids if want_ids else None)] if req.chat else []
        tools = req.chat and self._tool_parsing(req)
        want_lp = req.logprobs
        first_ids = prompt.ids if want_ids and not req.chat else None
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
            if upto > sent or want_lp or want_ids:
                lp = [(self.tok.decode([item.token_id]), item.logprob)] if want_lp else None
                top = [item.top] if want_lp and item.top is not None else None
                out = [*lead, Delta(content=text[sent:upto], logprobs=lp, top_logprobs=top,
                                    token_ids=[item.token_id] if want_ids else None, prompt_ids=first_ids)]
                sent, first_ids = max(sent, upto), None
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
        return bool(req.tools)  # none under tool_choice "none": the model was not shown them

    def _result(self, req: Request, comp: Completion, tokens: list[str] | None) -> Result:
        u = usage(len(comp.prompt_ids), len(comp.completion_ids))
        common: dict[str, Any] = dict(usage=u, prompt_ids=comp.prompt_ids, completion_ids=comp.completion_ids,
                                      logprobs=comp.logprobs, weight_version=comp.weight_version, tokens=tokens,
                                      top_logprobs=comp.top_logprobs if tokens is not None else None)
        if not req.chat:
            return Result(text=comp.text, finish_reason=comp.finish_reason, **common)
        content, calls = parse_hermes(comp.text) if self._tool_parsing(req) else (comp.text, [])
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        return Result(text=content, finish_reason="tool_calls" if calls else comp.finish_reason, message=msg,
                      **common)
