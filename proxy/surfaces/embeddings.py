"""`POST /v1/embeddings`: a harness with retrieval or memory embeds through the same base URL.

With an upstream (pass-through, or the token route over one) the request goes to the
upstream's own /v1/embeddings as is. With the local backend an embedding is the mean of the
model's last hidden states over the input's tokens (padding masked out). The call is recorded
with endpoint `embeddings`, its request and token usage — a non-trainable call that compile
counts and skips, never a sample. The recorded response keeps the shape and the vector sizes,
not the vectors (megabytes per batch, and nothing downstream reads them).
"""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
import orjson
from starlette.responses import Response

from harnessrl.proxy.errors import UpstreamMalformed, as_proxy_error, bad_request, error_response
from harnessrl.proxy.validate import MODEL_MAX, valid_model
from harnessrl.proxy.identity import Identity
from harnessrl.proxy.protocol import Request
from harnessrl.proxy.serving import Serving
from harnessrl.proxy.surfaces.adapter import Adapter, Wire
from harnessrl.proxy.upstream.vllm_wire import upstream_error

MAX_INPUTS = 2048


class EmbeddingsRequest(Request):
    __slots__ = ()

    @property
    def endpoint(self) -> str:
        return "embeddings"


def _is_ids(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                   for t in v)


def inputs_of(body: dict) -> list[str] | list[list[int]]:
    """`input` as a list of strings or a list of token-id lists (a 400 naming `input` if neither)."""
    x = body.get("input")
    if isinstance(x, str) and x:
        return [x]
    if _is_ids(x):
        return [x]
    if isinstance(x, list) and 0 < len(x) <= MAX_INPUTS:
        if all(isinstance(s, str) and s for s in x) or all(_is_ids(s) for s in x):
            return x
    raise bad_request(f"'input' must be a non-empty string, a list of at most {MAX_INPUTS} non-empty strings, "
                      "a list of token ids, or a list of token-id lists", param="input", code="invalid_type")


def embeddings_request(body: dict) -> Request:
    inputs_of(body)
    if body.get("model") is not None and not valid_model(body["model"]):
        raise bad_request(f"'model' must be a string of at most {MODEL_MAX} characters without control characters",
                          param="model", code="invalid_type")
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise bad_request("'encoding_format' must be 'float' or 'base64'", param="encoding_format",
                          code="invalid_value")
    dims = body.get("dimensions")
    if dims is not None and not (isinstance(dims, int) and not isinstance(dims, bool) and dims > 0):
        raise bad_request("'dimensions' must be a positive integer", param="dimensions", code="invalid_type")
    return EmbeddingsRequest(body, chat=False)


EMBEDDINGS = Adapter("embeddings", embeddings_request, lambda _req, _call_id, _model: None)  # type: ignore[arg-type]


async def serve_embeddings(serving: Serving, req: Request, ident: Identity, call_id: str, _wire: Wire) -> Response:
    """Serve and record an embeddings call (`Serving.embeddings`). Its answer is one JSON object
    (the surface has no wire: `_wire` is None)."""
    t0 = time.perf_counter()
    rec = serving.record(req, ident, call_id)
    headers = {"x-harnessrl-call": call_id}
    try:
        data = await _embed(serving.route, req.body, req.upstream)
        usage = data.get("usage") or {}
        rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        rec.completion_tokens = 0
        rec.response = {"object": data.get("object"), "model": data.get("model"), "usage": usage,
                        "data": [{"index": d.get("index"), "size": _size(d.get("embedding"))}
                                 for d in data.get("data") or []]}
        rec.latency_ms = (time.perf_counter() - t0) * 1e3
    except Exception as exc:  # noqa: BLE001 - every failure is recorded and answered
        return error_response(await serving.fail(rec, as_proxy_error(exc), t0), headers)
    try:
        await serving.commit(rec)
    except Exception as exc:  # noqa: BLE001
        return error_response(as_proxy_error(exc), headers)
    return Response(orjson.dumps(data), 200, headers, "application/json")


async def _embed(route: Any, body: dict, via: Any = None) -> dict:
    pool = via or getattr(route, "pool", None) or getattr(getattr(route, "backend", None), "pool", None)
    if pool is not None:  # the upstream embeds
        resp = await pool.request("POST", "/v1/embeddings", orjson.dumps(body))
        if resp.status != 200:
            raise upstream_error(resp.status, resp.body)
        try:
            data = orjson.loads(resp.body)
        except orjson.JSONDecodeError as exc:
            raise UpstreamMalformed(exc) from None
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise UpstreamMalformed("an embeddings answer without a 'data' list")
        return data
    backend = route.backend
    if body.get("dimensions") is not None:
        raise bad_request("'dimensions' is not supported by the local backend (its size is the model's hidden size)",
                          param="dimensions", code="unsupported_parameter")
    inputs = inputs_of(body)
    tok = backend.tokenizer
    # up to the body limit of text: tokenized off the event loop, as prompts are
    batch = await route.off_loop(lambda: [tok.encode(x) if isinstance(x, str) else list(x) for x in inputs])
    vectors = await backend.embed(batch)
    as_b64 = body.get("encoding_format") == "base64"
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() if as_b64 else v}
            for i, v in enumerate(vectors)]
    n = sum(len(b) for b in batch)
    return {"object": "list", "data": data, "model": body.get("model") or route.model_name,
            "usage": {"prompt_tokens": n, "total_tokens": n}}


def _size(embedding: Any) -> int:
    """A vector's length, floats or base64 float32."""
    if isinstance(embedding, str):
        return len(base64.b64decode(embedding)) // 4
    return len(embedding or ())
