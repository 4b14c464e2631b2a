"""A weight push through a proxy with several upstreams: drain, reload, check, resume.

For each upstream (one at a time with "rolling", all together with "all"): close its gate so no
new call is dispatched to it (calls that arrive meanwhile wait, bounded, in `Upstreams.acquire`,
then get a retryable 503), wait for its calls in flight (bounded by the drain timeout), reload
it the way vLLM reloads, check that it answers with the new version, and open the gate again.
No call is in flight on an upstream while it reloads, so no call's tokens span two versions, and
a session (sticky to its upstream) sees its upstream's versions in order, never an older one
after a newer one. vLLM's OpenAI routes report no weight version (0.32), so the version confirmed
here is what the calls an upstream answers afterwards record (`Lease.version`).

vLLM's reload API (what `trainer/push.py` uses against a bare vLLM): full weights by
`POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}` then
`POST /reset_prefix_cache`; a LoRA adapter by `POST /v1/load_lora_adapter {"lora_name": VERSION,
"lora_path": DIR}`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import orjson

from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.upstream.vllm_wire import weight_version_of
from harnessrl.proxy.upstream.ring import Upstream, Upstreams

log = logging.getLogger("harnessrl.proxy")


async def push_all(ups: Upstreams, path: str, version: str, lora: bool, mode: str, drain_timeout_s: float) -> dict:
    """Push to every upstream; returns {"version", "upstreams": [{url, version, drained, paused_s}]}."""
    async with ups.push_lock:
        targets = ups.all
        if mode == "all":
            reports = await asyncio.gather(*(_push_one(u, path, version, lora, drain_timeout_s) for u in targets))
        else:
            reports = [await _push_one(u, path, version, lora, drain_timeout_s) for u in targets]
    return {"version": version, "upstreams": list(reports)}


async def _push_one(u: Upstream, path: str, version: str, lora: bool, drain_timeout_s: float) -> dict:
    t0 = time.monotonic()
    u.open.clear()
    try:
        try:
            await asyncio.wait_for(u.idle.wait(), drain_timeout_s)
            drained = True
        except asyncio.TimeoutError:
            # reloading anyway: a call still running may then span two versions, which vLLM's
            # weight_versions spans record (the call's weight_version lists both)
            drained = False
            log.warning("push: %d call(s) still in flight on %s after %.0f s; reloading anyway",
                        u.inflight, u.url, drain_timeout_s)
        await _reload(u, path, version, lora)
        u.version = await _check(u, version, lora)
        u.adapter = version if lora else None
    finally:
        u.open.set()
    return {"url": u.url, "version": u.version, "drained": drained, "paused_s": round(time.monotonic() - t0, 3)}


async def _post(u: Upstream, path: str, payload: dict | None) -> None:
    try:
        resp = await u.pool.request("POST", path, orjson.dumps(payload) if payload is not None else None)
    except Exception as exc:  # noqa: BLE001 - unreachable or timed out: the push failed on this upstream
        raise ProxyError(502, f"push to upstream {u.url} failed: {type(exc).__name__}: {exc}", "upstream_error",
                         code="push_failed") from None
    if resp.status >= 400:
        raise ProxyError(502, f"push to upstream {u.url} failed: {path} answered {resp.status}: "
                              f"{resp.body[:200].decode('utf-8', 'replace')}", "upstream_error", code="push_failed")


def _tied(path: str) -> bool:
    try:
        return bool(orjson.loads((Path(path) / "config.json").read_bytes()).get("tie_word_embeddings"))
    except (OSError, ValueError):
        return False


async def _reload(u: Upstream, path: str, version: str, lora: bool) -> None:
    if not lora and _tied(path):
        log.warning("push: %s ties its output layer to its embeddings; vLLM 0.32's reload_weights leaves that "
                    "layer at its old weights (docs/vllm.md)", path)
    if lora:
        await _post(u, "/v1/load_lora_adapter", {"lora_name": version, "lora_path": path})
    else:
        await _post(u, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": path}})
        await _post(u, "/reset_prefix_cache", None)


async def _check(u: Upstream, version: str, lora: bool) -> str:
    """One token from the reloaded upstream: it answers. Returns the weight version it reports
    (else the pushed one)."""
    body = {"model": version if lora else await _model_id(u), "prompt": "ping", "max_tokens": 1,
            "return_weight_versions": True}
    try:
        resp = await u.pool.request("POST", "/v1/completions", orjson.dumps(body))
        data = orjson.loads(resp.body) if resp.status == 200 else None
    except Exception as exc:  # noqa: BLE001
        raise ProxyError(502, f"upstream {u.url} does not answer after the reload: {type(exc).__name__}",
                         "upstream_error", code="push_failed") from None
    if data is None:
        raise ProxyError(502, f"upstream {u.url} answers {resp.status} after the reload", "upstream_error",
                         code="push_failed")
    got = weight_version_of(((data.get("choices") or [{}])[0] or {}).get("weight_versions"))
    if got is not None and got != version:
        # its own naming of versions (calls record what it reports): worth a line, not a failure
        log.warning("push: upstream %s reports weight version %r after loading %r", u.url, got, version)
    return got or version


async def _model_id(u: Upstream) -> str:
    try:
        resp = await u.pool.request("GET", "/v1/models")
        return str(orjson.loads(resp.body)["data"][0]["id"])
    except Exception:  # noqa: BLE001 - no model list: vLLM's default name is the served model's
        return "default"
