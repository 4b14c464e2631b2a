"""A vLLM upstream used as a token backend (prefix-consistent mode for upstreams): the proxy
builds the prompt ids itself and sends them through `/v1/completions` with a token-id prompt."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from harnessrl.proxy.backend import Completion, SamplingParams, TokenDelta
from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.httpclient import Pool
from harnessrl.proxy.upstream import sse_events, weight_version_of


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


class UpstreamTokens:
    """generate/stream on token ids through an upstream's `/v1/completions`."""

    def __init__(self, pool: Pool, tokenizer: Any, model_name: str) -> None:
        self.pool = pool
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.weight_version = "upstream"
        self._eos_id = tokenizer.eos_token_id
        self._eos_text = tokenizer.eos_token

    def _body(self, prompt_ids: list[int], params: SamplingParams, stream: bool) -> bytes:
        body: dict[str, Any] = {
            "model": self.model_name, "prompt": prompt_ids, "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "logprobs": 0,
            "return_token_ids": True, "return_weight_versions": True,
            # tool-call tags are special tokens in many tokenizers: keep them in the text
            "skip_special_tokens": False, "stream": stream,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = params.stop
        return orjson.dumps(body)

    def _text(self, ids: list[int]) -> str:
        if ids and ids[-1] == self._eos_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _completion(self, prompt_ids, ids, lps, finish, version) -> Completion:
        if version:
            self.weight_version = version
        return Completion(prompt_ids, ids, lps, self._text(ids), finish or "stop", self.weight_version)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        resp = await self.pool.request("POST", "/v1/completions", self._body(prompt_ids, params, False))
        if resp.status != 200:
            raise upstream_error(resp.status, resp.body)
        ch = orjson.loads(resp.body)["choices"][0]
        return self._completion(prompt_ids, ch["token_ids"], ch["logprobs"]["token_logprobs"],
                                ch.get("finish_reason"), weight_version_of(ch.get("weight_versions")))

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenDelta | Completion]:
        resp, chunks = await self.pool.stream("POST", "/v1/completions", self._body(prompt_ids, params, True))
        if resp.status != 200:
            raise upstream_error(resp.status, b"".join([c async for c in chunks]))
        ids: list[int] = []
        lps: list[float] = []
        finish = version = None
        buf = bytearray()
        async for data in chunks:
            for payload in sse_events(buf, data):
                if payload == b"[DONE]":
                    continue
                for ch in orjson.loads(payload).get("choices") or []:
                    new_ids = ch.get("token_ids") or []
                    new_lps = (ch.get("logprobs") or {}).get("token_logprobs") or []
                    text = (ch.get("text") or "").replace(self._eos_text, "")
                    for j, (tid, lp) in enumerate(zip(new_ids, new_lps)):
                        yield TokenDelta(tid, lp, text if j == 0 else "")
                    ids += new_ids
                    lps += new_lps
                    finish = ch.get("finish_reason") or finish
                    version = weight_version_of(ch.get("weight_versions")) or version
        yield self._completion(prompt_ids, ids, lps, finish, version)
