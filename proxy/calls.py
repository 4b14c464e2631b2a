"""One harness call, end to end: build/forward the request, record it, answer it.

Two routes to a model:
- pass-through to an OpenAI-compatible upstream (vLLM), adding and then stripping the RL fields;
- token route: the proxy renders the prompt ids itself (prefix-consistent when the call extends
  an earlier one) and asks a token backend — the embedded local backend, or an upstream's
  `/v1/completions` in prefix mode — then builds the OpenAI response, parsing hermes tool calls.

Every outcome, success or failure, is committed before the harness gets its answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from harnessrl.proxy.backend import Completion, SamplingParams, TokenBackend, TokenDelta
from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.httpclient import Pool, UpstreamConnectionError
from harnessrl.proxy.identity import Identity
from harnessrl.proxy.prefix import PrefixIndex, Prompter, Turn
from harnessrl.proxy.recorder import CallRecord, Recorder
from harnessrl.proxy.toolparse import parse_hermes, streamable_prefix
from harnessrl.proxy.upstream import StreamAssembler, extract_and_strip, prepare, sse_events
from harnessrl.proxy.upstream_tokens import upstream_error
from harnessrl.errors import UserError
from harnessrl.records import pack_ids, pack_logprobs

SSE_DONE = b"data: [DONE]\n\n"


def _sse(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _usage(n_prompt: int, n_completion: int) -> dict:
    return {"prompt_tokens": n_prompt, "completion_tokens": n_completion, "total_tokens": n_prompt + n_completion}


class Calls:
    def __init__(self, recorder: Recorder, *, pool: Pool | None = None, backend: TokenBackend | None = None,
                 prompter: Prompter | None = None, model_name: str = "model", default_max_tokens: int = 256) -> None:
        self.recorder = recorder
        self.pool = pool  # pass-through upstream (None on the local backend)
        self.backend = backend  # token backend (local, or upstream in prefix mode)
        self.prompter = prompter
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        self.index = PrefixIndex()
        tok = prompter.tok if prompter is not None else None
        # ids that end an assistant turn (known when the proxy has the tokenizer)
        self.eos_ids: frozenset[int] = frozenset(
            getattr(backend, "eos_token_ids", None) or ([tok.eos_token_id] if tok is not None else []))

    # ---- shared -------------------------------------------------------------------------
    def _record(self, call_id: str, ident: Identity, endpoint: str, req: dict) -> CallRecord:
        return CallRecord(id=call_id, rollout_id=ident.rollout, session_id=ident.session, agent=ident.agent,
                          parent_call_id=ident.parent_call, endpoint=endpoint, model=req.get("model"),
                          stream=bool(req.get("stream")), request=req, created_at=time.time())

    def _headers(self, rec: CallRecord) -> dict[str, str]:
        return {"x-harnessrl-call": rec.id}

    async def _fail(self, rec: CallRecord, t0: float, err: ProxyError) -> Response:
        rec.status, rec.error = "error", f"{err.status} {err.type}: {err.message}"
        rec.latency_ms = (time.perf_counter() - t0) * 1e3
        await self.recorder.commit(rec)
        return Response(err.body(), err.status, self._headers(rec), "application/json")

    def _fill(self, rec: CallRecord, t0: float, prompt_ids, completion_ids, logprobs, weight_version,
              usage: dict | None, finish: str | None) -> None:
        rec.prompt_ids = pack_ids(prompt_ids)
        rec.completion_ids = pack_ids(completion_ids)
        rec.completion_logprobs = pack_logprobs(logprobs)
        rec.weight_version = weight_version
        usage = usage or {}
        rec.prompt_tokens = usage.get("prompt_tokens", len(prompt_ids) if prompt_ids is not None else None)
        rec.completion_tokens = usage.get("completion_tokens",
                                          len(completion_ids) if completion_ids is not None else None)
        rec.finish_reason = finish
        rec.latency_ms = (time.perf_counter() - t0) * 1e3

    def _remember(self, rec: CallRecord, ident: Identity, req: dict, reply: dict | None,
                  prompt_ids: list[int] | None, completion_ids: list[int] | None) -> None:
        if reply is None or not prompt_ids or completion_ids is None:
            return
        self.index.add((ident.rollout, ident.agent, ident.session),
                       Turn.of(rec.id, req["messages"], req.get("tools"), reply, prompt_ids, completion_ids,
                               self.eos_ids))

    def _find(self, ident: Identity, req: dict) -> Turn | None:
        return self.index.find((ident.rollout, ident.agent, ident.session), req["messages"], req.get("tools"))

    # ---- chat ---------------------------------------------------------------------------
    async def chat(self, req: dict, ident: Identity, call_id: str) -> Response:
        rec = self._record(call_id, ident, "chat", req)
        turn = self._find(ident, req)
        if self.backend is not None:
            return await self._chat_tokens(req, ident, rec, turn)
        return await self._passthrough(req, ident, rec, turn, chat=True)

    async def completions(self, req: dict, ident: Identity, call_id: str) -> Response:
        rec = self._record(call_id, ident, "completions", req)
        rec.prompt_path = "raw"
        if self.backend is not None:
            return await self._completion_tokens(req, rec)
        return await self._passthrough(req, ident, rec, None, chat=False)

    # ---- pass-through upstream ----------------------------------------------------------
    async def _passthrough(self, req: dict, ident: Identity, rec: CallRecord, turn: Turn | None,
                           chat: bool) -> Response:
        t0 = time.perf_counter()
        assert self.pool is not None
        body, wants = prepare(req, chat)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        if chat:
            rec.prompt_path = "render"
            rec.prefix_call_id = turn.call_id if turn else None
        try:
            if req.get("stream"):
                resp, chunks = await self.pool.stream("POST", path, body)
                if resp.status != 200:
                    return await self._fail(rec, t0, upstream_error(resp.status, b"".join([c async for c in chunks])))
                return StreamingResponse(self._relay(chunks, StreamAssembler(wants, chat), req, ident, rec, turn, t0),
                                         media_type="text/event-stream", headers=self._headers(rec))
            resp = await self.pool.request("POST", path, body)
        except (UpstreamConnectionError, asyncio.TimeoutError) as exc:
            return await self._fail(rec, t0, _transport_error(exc))
        if resp.status != 200:
            return await self._fail(rec, t0, upstream_error(resp.status, resp.body))
        try:
            data = orjson.loads(resp.body)
            ex = extract_and_strip(data, wants, chat)
        except Exception as exc:  # noqa: BLE001 - a malformed upstream answer is the upstream's error
            return await self._fail(rec, t0, ProxyError(502, f"malformed upstream response: {exc}", "upstream_error"))
        self._fill(rec, t0, ex.prompt_ids, ex.completion_ids, ex.logprobs, ex.weight_version, ex.usage,
                   ex.finish_reason)
        rec.response, rec.response_text, rec.tool_calls = data, ex.text, ex.tool_calls
        rec.drift = _drift(turn, ex.prompt_ids)
        await self.recorder.commit(rec)
        if chat:
            self._remember(rec, ident, req, ex.reply, ex.prompt_ids, ex.completion_ids)
        return Response(orjson.dumps(data), 200, self._headers(rec), "application/json")

    async def _relay(self, chunks: AsyncIterator[bytes], asm: StreamAssembler, req: dict, ident: Identity,
                     rec: CallRecord, turn: Turn | None, t0: float) -> AsyncIterator[bytes]:
        """Forward stream chunks as they come, but hold the terminal ones until committed."""
        held: list[bytes] = []
        buf = bytearray()
        try:
            async for data in chunks:
                ready = []  # events that arrived together go out in one write
                for payload in sse_events(buf, data):
                    if payload == b"[DONE]":
                        continue
                    obj = orjson.loads(payload)
                    out = asm.feed(obj)
                    terminal = held or not obj.get("choices") or any(c.get("finish_reason") for c in obj["choices"])
                    if out is None:
                        continue
                    (held if terminal else ready).append(_sse(out))
                if ready:
                    yield b"".join(ready)
        except (UpstreamConnectionError, asyncio.TimeoutError) as exc:
            err = _transport_error(exc)
            await self._fail(rec, t0, err)
            yield b"data: " + err.body() + b"\n\n"
            return
        ex, full = asm.finish()
        self._fill(rec, t0, ex.prompt_ids, ex.completion_ids, ex.logprobs, ex.weight_version, ex.usage,
                   ex.finish_reason)
        rec.response, rec.response_text, rec.tool_calls = full, ex.text, ex.tool_calls
        rec.drift = _drift(turn, ex.prompt_ids)
        async for piece in self._commit_then(rec, held):
            yield piece
        if asm.chat:
            self._remember(rec, ident, req, ex.reply, ex.prompt_ids, ex.completion_ids)

    async def _commit_then(self, rec: CallRecord, tail: list[bytes]) -> AsyncIterator[bytes]:
        try:
            await self.recorder.commit(rec)
        except Exception as exc:  # noqa: BLE001 - the stream ends with an error instead of [DONE]
            yield b"data: " + ProxyError(500, str(exc), "server_error").body() + b"\n\n"
            return
        for piece in tail:
            yield piece
        yield SSE_DONE

    # ---- token route --------------------------------------------------------------------
    def _params(self, req: dict) -> SamplingParams:
        stop = req.get("stop") or []
        return SamplingParams(
            max_tokens=req.get("max_completion_tokens") or req.get("max_tokens") or self.default_max_tokens,
            temperature=1.0 if req.get("temperature") is None else float(req["temperature"]),
            top_p=1.0 if req.get("top_p") is None else float(req["top_p"]),
            seed=req.get("seed"),
            stop=[stop] if isinstance(stop, str) else list(stop),
        )

    def _tool_parsing(self, req: dict) -> bool:
        return bool(req.get("tools")) and req.get("tool_choice") != "none"

    def _reply(self, req: dict, text: str) -> tuple[dict, list]:
        content, calls = parse_hermes(text) if self._tool_parsing(req) else (text, [])
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        return msg, calls

    def _logprobs_json(self, comp: Completion) -> dict:
        tok = self.prompter.tok if self.prompter else self.backend.tokenizer  # type: ignore[union-attr]
        return {"content": [{"token": tok.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                            for t, lp in zip(comp.completion_ids, comp.logprobs)]}

    async def _chat_tokens(self, req: dict, ident: Identity, rec: CallRecord, turn: Turn | None) -> Response:
        t0 = time.perf_counter()
        assert self.backend is not None and self.prompter is not None
        try:
            plan = self.prompter.plan(req["messages"], req.get("tools"), turn)
        except Exception as exc:  # noqa: BLE001 - e.g. a template that rejects the messages
            raise ProxyError(400, f"cannot render the messages with the chat template: {exc}",
                             param="messages", code="template_error") from None
        rec.prompt_path, rec.prefix_call_id, rec.drift = plan.path, plan.prefix_call_id, plan.drift
        params = self._params(req)
        head = {"id": f"chatcmpl-{rec.id}", "created": int(time.time()), "model": req.get("model") or self.model_name}
        if req.get("stream"):
            return StreamingResponse(self._chat_token_stream(req, ident, rec, plan.ids, params, head, t0),
                                     media_type="text/event-stream", headers=self._headers(rec))
        try:
            comp = await self.backend.generate(plan.ids, params)
        except Exception as exc:  # noqa: BLE001 - recorded as a failed call
            return await self._fail(rec, t0, _backend_error(exc))
        msg, calls = self._reply(req, comp.text)
        finish = "tool_calls" if calls else comp.finish_reason
        choice = {"index": 0, "message": msg, "finish_reason": finish,
                  "logprobs": self._logprobs_json(comp) if req.get("logprobs") else None}
        data = {**head, "object": "chat.completion", "choices": [choice],
                "usage": _usage(len(comp.prompt_ids), len(comp.completion_ids))}
        self._fill(rec, t0, comp.prompt_ids, comp.completion_ids, comp.logprobs, comp.weight_version,
                   data["usage"], finish)
        rec.response, rec.response_text, rec.tool_calls = data, msg["content"], calls or None
        await self.recorder.commit(rec)
        self._remember(rec, ident, req, msg, comp.prompt_ids, comp.completion_ids)
        return Response(orjson.dumps(data), 200, self._headers(rec), "application/json")

    async def _chat_token_stream(self, req: dict, ident: Identity, rec: CallRecord, prompt_ids: list[int],
                                 params: SamplingParams, head: dict, t0: float) -> AsyncIterator[bytes]:
        assert self.backend is not None
        base = {**head, "object": "chat.completion.chunk"}
        tools = self._tool_parsing(req)
        want_lp = bool(req.get("logprobs"))

        def chunk(delta: dict, finish: str | None = None, logprobs: Any = None) -> bytes:
            return _sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                                              "finish_reason": finish}]})

        yield chunk({"role": "assistant", "content": ""})
        text, sent = "", 0
        comp: Completion | None = None
        try:
            async for item in self.backend.stream(prompt_ids, params):
                if isinstance(item, Completion):
                    comp = item
                    break
                assert isinstance(item, TokenDelta)
                text += item.text
                upto = streamable_prefix(text) if tools else len(text)
                if upto > sent or want_lp:
                    lp = ({"content": [{"token": item.text, "logprob": item.logprob, "bytes": None,
                                        "top_logprobs": []}]} if want_lp else None)
                    yield chunk({"content": text[sent:upto]}, None, lp)
                    sent = max(sent, upto)
            if comp is None:
                raise RuntimeError("the backend stream ended without a completion")
        except Exception as exc:  # noqa: BLE001 - recorded; the stream ends with the error
            err = _backend_error(exc)
            await self._fail(rec, t0, err)
            yield b"data: " + err.body() + b"\n\n"
            return
        msg, calls = self._reply(req, comp.text)
        content = msg["content"] or ""
        tail: list[bytes] = []
        if len(content) > sent and content.startswith(text[:sent]):
            tail.append(chunk({"content": content[sent:]}))
        if calls:
            tail.append(chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}))
        finish = "tool_calls" if calls else comp.finish_reason
        usage = _usage(len(comp.prompt_ids), len(comp.completion_ids))
        tail.append(chunk({}, finish))
        if (req.get("stream_options") or {}).get("include_usage"):
            tail.append(_sse({**base, "choices": [], "usage": usage}))
        data = {**head, "object": "chat.completion",
                "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}], "usage": usage}
        self._fill(rec, t0, comp.prompt_ids, comp.completion_ids, comp.logprobs, comp.weight_version, usage, finish)
        rec.response, rec.response_text, rec.tool_calls = data, msg["content"], calls or None
        async for piece in self._commit_then(rec, tail):
            yield piece
        self._remember(rec, ident, req, msg, comp.prompt_ids, comp.completion_ids)

    async def _completion_tokens(self, req: dict, rec: CallRecord) -> Response:
        t0 = time.perf_counter()
        assert self.backend is not None
        p = req["prompt"]
        if isinstance(p, list) and isinstance(p[0], str):
            p = p[0]
        prompt_ids = self.backend.tokenizer.encode(p) if isinstance(p, str) else p
        params = self._params(req)
        head = {"id": f"cmpl-{rec.id}", "created": int(time.time()), "model": req.get("model") or self.model_name,
                "object": "text_completion"}
        if req.get("stream"):
            return StreamingResponse(self._completion_stream(req, rec, prompt_ids, params, head, t0),
                                     media_type="text/event-stream", headers=self._headers(rec))
        try:
            comp = await self.backend.generate(prompt_ids, params)
        except Exception as exc:  # noqa: BLE001
            return await self._fail(rec, t0, _backend_error(exc))
        data = {**head, "choices": [{"index": 0, "text": comp.text, "finish_reason": comp.finish_reason,
                                     "logprobs": self._text_logprobs(comp) if req.get("logprobs") is not None else None}],
                "usage": _usage(len(comp.prompt_ids), len(comp.completion_ids))}
        self._fill(rec, t0, comp.prompt_ids, comp.completion_ids, comp.logprobs, comp.weight_version,
                   data["usage"], comp.finish_reason)
        rec.response, rec.response_text = data, comp.text
        await self.recorder.commit(rec)
        return Response(orjson.dumps(data), 200, self._headers(rec), "application/json")

    def _text_logprobs(self, comp: Completion) -> dict:
        tok = self.backend.tokenizer  # type: ignore[union-attr]
        tokens = [tok.decode([t]) for t in comp.completion_ids]
        return {"tokens": tokens, "token_logprobs": list(comp.logprobs), "top_logprobs": None, "text_offset": None}

    async def _completion_stream(self, req: dict, rec: CallRecord, prompt_ids: list[int], params: SamplingParams,
                                 head: dict, t0: float) -> AsyncIterator[bytes]:
        assert self.backend is not None
        comp: Completion | None = None
        try:
            async for item in self.backend.stream(prompt_ids, params):
                if isinstance(item, Completion):
                    comp = item
                    break
                if item.text:
                    yield _sse({**head, "choices": [{"index": 0, "text": item.text, "finish_reason": None,
                                                     "logprobs": None}]})
            if comp is None:
                raise RuntimeError("the backend stream ended without a completion")
        except Exception as exc:  # noqa: BLE001
            err = _backend_error(exc)
            await self._fail(rec, t0, err)
            yield b"data: " + err.body() + b"\n\n"
            return
        usage = _usage(len(comp.prompt_ids), len(comp.completion_ids))
        tail = [_sse({**head, "choices": [{"index": 0, "text": "", "finish_reason": comp.finish_reason,
                                           "logprobs": None}]})]
        if (req.get("stream_options") or {}).get("include_usage"):
            tail.append(_sse({**head, "choices": [], "usage": usage}))
        data = {**head, "choices": [{"index": 0, "text": comp.text, "finish_reason": comp.finish_reason,
                                     "logprobs": None}], "usage": usage}
        self._fill(rec, t0, comp.prompt_ids, comp.completion_ids, comp.logprobs, comp.weight_version, usage,
                   comp.finish_reason)
        rec.response, rec.response_text = data, comp.text
        async for piece in self._commit_then(rec, tail):
            yield piece


def _drift(turn: Turn | None, prompt_ids: list[int] | None) -> bool | None:
    """Whether the upstream's rendering of an extending call lost the earlier call's exact ids."""
    if turn is None or prompt_ids is None:
        return None
    return not turn.starts(prompt_ids)


def _transport_error(exc: BaseException) -> ProxyError:
    if isinstance(exc, asyncio.TimeoutError):
        return ProxyError(504, "the upstream did not answer in time", "upstream_timeout", code="timeout")
    return ProxyError(502, str(exc), "upstream_error", code="upstream_unreachable")


def _backend_error(exc: BaseException) -> ProxyError:
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, UserError):  # e.g. the prompt does not fit the model's context
        return ProxyError(400, str(exc), "invalid_request_error", code="backend_rejected")
    if isinstance(exc, (UpstreamConnectionError, asyncio.TimeoutError)):
        return _transport_error(exc)
    return ProxyError(500, f"model backend failed: {exc}", "server_error", code="backend_error")
