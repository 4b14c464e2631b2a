"""A vLLM upstream used as a token backend (prefix-consistent mode for upstreams): the proxy
builds the prompt ids itself and sends them through `/v1/completions` with a token-id prompt.

The `model` of those calls is the LoRA adapter last pushed to the upstream through the proxy, else
`--upstream-model`, else the name the upstream serves (the first id of its `/v1/models`, asked
once per upstream): vLLM answers any other name with a 404, and the harness's own model name
means nothing to it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson

from harnessrl.proxy.routes.token_backend import Completion, SamplingParams, TokenDelta
from harnessrl.proxy.errors import ProxyError, UpstreamMalformed
from harnessrl.proxy.upstream.http_pool import Pool
from harnessrl.proxy.upstream.vllm_wire import (Extract, body_error, checked, error_in, sse_events, unfinished,
                                                upstream_error, weight_version_of)

log = logging.getLogger("harnessrl.proxy")


class UpstreamTokens:
    """generate/stream on token ids through an upstream's `/v1/completions`."""

    def __init__(self, pool: Pool, tokenizer: Any, model_name: str, upstream_model: str | None = None) -> None:
        self.pool = pool
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.upstream_model = upstream_model
        self.weight_version: str | None = None  # the last one the upstream reported (vLLM: none)
        self._served: dict[str, str] = {}  # upstream URL -> the model name it serves
        self._eos_id = tokenizer.eos_token_id
        self._eos_text = tokenizer.eos_token

    async def _served_model(self, pool: Any) -> str:
        if self.upstream_model is not None:
            return self.upstream_model
        url = getattr(pool, "url", "")
        if url not in self._served:
            try:
                resp = await pool.request("GET", "/v1/models")
                self._served[url] = str(orjson.loads(resp.body)["data"][0]["id"])
            except Exception as exc:  # noqa: BLE001 - no model list: the served name, asked again next call
                log.warning("%s/v1/models gave no model name (%s: %s); asking it for %r", url, type(exc).__name__,
                            exc, self.model_name)
                return self.model_name
        return self._served[url]

    async def _body(self, prompt_ids: list[int], params: SamplingParams, stream: bool) -> bytes:
        body: dict[str, Any] = {
            # a LoRA adapter pushed through the proxy is served only under its own name
            "model": getattr(params.via, "adapter", None) or await self._served_model(params.via or self.pool),
            "prompt": prompt_ids, "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "logprobs": params.top_logprobs,
            "return_token_ids": True, "return_weight_versions": True,
            # tool-call tags are special tokens in many tokenizers: keep them in the text. The weight
            # version fields are the stand-in's extension: vLLM 0.32's completions ignore them
            "skip_special_tokens": False, "stream": stream,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = params.stop
        body.update(params.upstream_fields)  # vLLM enforces response_format itself
        return orjson.dumps(body)

    def _text(self, ids: list[int]) -> str:
        if ids and ids[-1] == self._eos_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _completion(self, prompt_ids, ids, lps, finish, version, tops=None, via=None) -> Completion:
        try:
            checked(Extract(completion_ids=ids, logprobs=lps))
        except ValueError as exc:
            raise UpstreamMalformed(exc) from None
        if len(ids) != len(lps):
            raise UpstreamMalformed(f"{len(ids)} token ids but {len(lps)} log-probs")
        if (err := unfinished(finish, "completion")) is not None:  # never "stop" by default: training
            raise err  # would take a cut answer for a whole one
        if version:
            self.weight_version = version
        # an upstream that reports no version (vLLM's completions): the one the proxy pushed to it
        version = version or getattr(via, "version", None) or self.weight_version
        return Completion(prompt_ids, ids, lps, self._text(ids), finish, version, tops)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        resp = await (params.via or self.pool).request("POST", "/v1/completions", await self._body(prompt_ids, params, False))
        if resp.status != 200:
            raise upstream_error(resp.status, resp.body)
        try:
            data = orjson.loads(resp.body)
            if (err := error_in(data)) is not None:
                raise err
            ch = data["choices"][0]
            ids, lps = ch["token_ids"], ch["logprobs"]["token_logprobs"]
            finish, version = ch.get("finish_reason"), weight_version_of(ch.get("weight_versions"))
            tops = _tops(ch["logprobs"]) if params.top_logprobs else None
        except ProxyError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the shape, it is the upstream's error
            raise UpstreamMalformed(f"{type(exc).__name__}: {exc}") from None
        return self._completion(prompt_ids, ids, lps, finish, version, tops, params.via)

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenDelta | Completion]:
        resp, chunks = await (params.via or self.pool).stream("POST", "/v1/completions", await self._body(prompt_ids, params, True))
        if resp.status != 200:
            raise upstream_error(resp.status, b"".join([c async for c in chunks]))
        ids: list[int] = []
        lps: list[float] = []
        finish = version = None
        buf = bytearray()
        events = 0
        async for data in chunks:
            for payload in sse_events(buf, data):
                events += 1
                if payload == b"[DONE]":
                    continue
                for new_ids, new_lps, text, ch_finish, ch_version, new_tops in self._chunk(payload):
                    for j, (tid, lp) in enumerate(zip(new_ids, new_lps)):
                        yield TokenDelta(tid, lp, text if j == 0 else "",
                                         new_tops[j] if params.top_logprobs and j < len(new_tops) else None)
                    ids += new_ids
                    lps += new_lps
                    finish = ch_finish or finish
                    version = ch_version or version
        if not events:  # e.g. a JSON or HTML body where a stream was asked for
            if (err := body_error(buf)) is not None:
                raise err
            raise UpstreamMalformed(f"the stream held no SSE event: {bytes(buf[:200])!r}")
        yield self._completion(prompt_ids, ids, lps, finish, version, via=params.via)

    def _chunk(self, payload: bytes) -> list[tuple]:
        """(token ids, log-probs, text, finish reason, weight version) of each choice of a chunk."""
        try:
            chunk = orjson.loads(payload)
            if (err := error_in(chunk)) is not None:  # vLLM's error event: the stream failed
                raise err
            out = []
            for ch in chunk.get("choices") or []:
                ex = checked(Extract(completion_ids=ch.get("token_ids") or [],
                                     logprobs=(ch.get("logprobs") or {}).get("token_logprobs") or []))
                out.append((ex.completion_ids, ex.logprobs, (ch.get("text") or "").replace(self._eos_text, ""),
                            ch.get("finish_reason"), weight_version_of(ch.get("weight_versions")),
                            _tops(ch.get("logprobs") or {})))
            return out
        except ProxyError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the shape, it is the upstream's error
            raise UpstreamMalformed(f"stream chunk {payload[:200]!r}: {exc}") from None


def _tops(logprobs: dict) -> list[list[tuple[str, float]]]:
    """Completions `top_logprobs` (one {token text: log-prob} per token) as (text, log-prob) lists."""
    return [sorted(((str(t), float(v)) for t, v in (alts or {}).items()), key=lambda a: -a[1])
            for alts in logprobs.get("top_logprobs") or []]
