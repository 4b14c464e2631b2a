"""Pass-through route: forward the harness's request to an OpenAI-compatible upstream (vLLM),
asking it for token ids, log-probs and weight versions (`upstream.vllm_wire.prepare`), and hand back its
own response with those fields stripped — byte for byte what the upstream said otherwise."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson

from harnessrl.proxy.errors import ProxyError, UpstreamMalformed
from harnessrl.proxy.upstream.http_pool import Pool
from harnessrl.proxy.prefix.prompts import Turn
from harnessrl.proxy.protocol import Delta, Prompt, Request, Result
from harnessrl.proxy.upstream.vllm_wire import (Extract, StreamAssembler, body_error, extract_and_strip, prepare,
                                                sse_events)
from harnessrl.proxy.upstream.vllm_tokens import upstream_error


class PassThroughRoute:
    eos_ids: frozenset[int] = frozenset()  # the proxy has no tokenizer here

    def __init__(self, pool: Pool, model_name: str, upstream_model: str | None = None) -> None:
        self.pool = pool
        self.model_name = model_name
        self.upstream_model = upstream_model  # sent as `model` whatever the harness asked for

    async def prompt(self, req: Request, turn: Turn | None) -> Prompt:
        if not req.chat:
            return Prompt("raw")
        return Prompt("render", turn.call_id if turn else None, turn=turn)

    async def run(self, req: Request, prompt: Prompt) -> Result:
        body, wants = prepare(_with_model(req.body, _model(req, self.upstream_model)), req.chat)
        resp = await (req.upstream or self.pool).request("POST", _path(req), body)
        if resp.status != 200:
            raise upstream_error(resp.status, resp.body)
        try:
            data = orjson.loads(resp.body)
            ex = extract_and_strip(data, wants, req.chat)
        except ProxyError:  # the upstream's error, or a truncated answer
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the shape, it is the upstream's error
            raise UpstreamMalformed(exc) from None
        return _result(ex, data, prompt, req.upstream)

    async def stream(self, req: Request, prompt: Prompt) -> AsyncIterator[list[Delta] | Result]:
        body, wants = prepare(_with_model(req.body, _model(req, self.upstream_model)), req.chat)
        resp, chunks = await (req.upstream or self.pool).stream("POST", _path(req), body)
        if resp.status != 200:
            raise upstream_error(resp.status, b"".join([c async for c in chunks]))
        asm = StreamAssembler(wants, req.chat)
        progress = prompt.progress  # the assembler's own lists: what has come so far
        progress.completion_ids, progress.logprobs, progress.text = (
            asm.ex.completion_ids, asm.ex.logprobs, asm.content)  # type: ignore[assignment]
        buf = bytearray()
        try:
            async for data in chunks:
                batch = []
                for payload in sse_events(buf, data):
                    if payload == b"[DONE]":
                        continue
                    try:
                        delta = asm.feed(orjson.loads(payload))
                    except Exception as exc:  # noqa: BLE001
                        if batch:  # what came before the bad chunk still goes out first
                            yield batch
                        if isinstance(exc, ProxyError):  # the upstream's own error event
                            raise
                        raise UpstreamMalformed(f"stream chunk {payload[:200]!r}: {exc}") from None
                    if delta is not None:
                        batch.append(delta)
                progress.prompt_ids = asm.ex.prompt_ids
                if batch:
                    yield batch
        finally:  # a harness that hung up: the upstream connection is closed, so it stops generating
            await chunks.aclose()  # type: ignore[attr-defined]
        if not asm.answered and (err := body_error(buf)) is not None:
            raise err
        try:
            ex, full = asm.finish()
        except ProxyError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise UpstreamMalformed(f"{exc}{_rest(buf)}") from None
        yield _result(ex, full, prompt, req.upstream)


def _rest(buf: bytearray) -> str:
    """What the stream left that was not a whole SSE event (a body that is not SSE at all)."""
    return f"; it sent {bytes(buf[:200])!r}" if buf.strip() else ""


def _model(req: Request, configured: str | None) -> str | None:
    """A LoRA adapter pushed through the proxy (vLLM serves it only to calls naming it), else the
    configured `--upstream-model`, else (None) the harness's own."""
    return getattr(req.upstream, "adapter", None) or configured


def _with_model(body: dict, model: str | None) -> dict:
    return body if model is None else {**body, "model": model}


def _path(req: Request) -> str:
    return "/v1/chat/completions" if req.chat else "/v1/completions"


def _result(ex: Extract, data: dict, prompt: Prompt, lease: object = None) -> Result:
    drift = None
    if prompt.turn is not None and ex.prompt_ids is not None:
        # the upstream's own rendering of an extending call lost the earlier call's exact ids
        drift = not prompt.turn.starts(ex.prompt_ids)
    return Result(text=ex.text, finish_reason=ex.finish_reason, usage=ex.usage, message=ex.reply,
                  prompt_ids=ex.prompt_ids, completion_ids=ex.completion_ids, logprobs=ex.logprobs,
                  # vLLM's OpenAI routes report no version: the one the proxy last pushed to it
                  weight_version=ex.weight_version or getattr(lease, "version", None), drift=drift, raw=data)
