"""`n > 1` and Completions `best_of`: several samples of one prompt, each its own call record.

The prompt is planned once; the route then runs once per sample, concurrently (the local
backend queues them on its one worker; an upstream gets one request per sample and its prefix
cache serves the shared prompt once). Why one route run per sample rather than one upstream
request with `n`: each sample's ids, log-probs, weight version and finish reason are then read
exactly as a single call's, by the same code, on every route. A sample with a `seed` gets
`seed + i` (wrapping as a signed 64-bit integer, the range vLLM takes), so seeded samples differ
and stay reproducible.

Every sample gets a call id and a record (siblings in the session's prefix tree: compile sees
them as branches), all are committed before the harness gets one response with n choices;
streamed, the samples' chunks are interleaved, each with its choice index; the 200 waits for every
sample's first chunk, so a rejected prompt is still an HTTP error (on the local backend, whose
one worker runs samples in turn, the stream starts once all but the last are done). If any
sample fails the harness gets that error, and every sample is recorded as failed (it saw none).

`best_of > n` (Completions): `best_of` samples are drawn and the n with the highest sum of
log-probs returned, as OpenAI does; the others are recorded with status `discarded` (the
harness never saw them, so the rollout's reward says nothing about them; compile skips them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator

import orjson
from starlette.responses import Response

from harnessrl.proxy.answers import Last, StreamAnswer
from harnessrl.proxy.record.call_rows import new_call_id
from harnessrl.proxy.errors import ProxyError, as_proxy_error, bad_request, error_response
from harnessrl.proxy.identity import Identity
from harnessrl.proxy.protocol import Delta, Request, Result
from harnessrl.proxy.record.recorder import CallRecord
from harnessrl.proxy.prefix.index import Turn
from harnessrl.proxy.serving import Serving
from harnessrl.proxy.surfaces.adapter import Wire


def check_best_of(body: dict) -> None:
    """Completions `best_of`: an integer ≥ n, not streamed when it asks for more than n."""
    b, n = body.get("best_of"), body.get("n") or 1
    if b is None:
        return
    if not (isinstance(b, int) and not isinstance(b, bool) and isinstance(n, int) and n <= b <= 64):
        raise bad_request("'best_of' must be an integer in [n, 64]", param="best_of", code="invalid_type")
    if b > n and body.get("stream"):
        raise bad_request("'best_of' greater than 'n' cannot be streamed (the best are known only at the end)",
                          param="best_of", code="invalid_value")


def sample_request(req: Request, i: int) -> Request:
    """The i-th sample's request: one choice, its own seed."""
    body = {k: v for k, v in req.body.items() if k not in ("n", "best_of")}
    if i and isinstance(body.get("seed"), int):  # (validate.py: within [-2^63, 2^63-1])
        body["seed"] = (body["seed"] + i + 2 ** 63) % 2 ** 64 - 2 ** 63
    return Request(body, req.chat, upstream=req.upstream, notes=req.notes)


async def handle_n(serving: Serving, req: Request, ident: Identity, call_id: str, wire: Wire) -> Response:
    t0 = time.perf_counter()
    k = req.best_of
    recs = [serving.record(req, ident, call_id if i == 0 else new_call_id()) for i in range(k)]
    headers = {"x-harnessrl-call": call_id}
    try:
        turn = serving.index.find(_key(ident), req.messages, req.tools) if req.chat else None
        prompt = await serving.route.prompt(req, turn)
    except Exception as exc:  # noqa: BLE001 - every failure is recorded and answered
        return error_response(await _fail_all(serving, recs, [as_proxy_error(exc)] * k, t0), headers)
    for rec in recs:
        rec.prompt_path, rec.prefix_call_id, rec.drift = prompt.path, prompt.prefix_call_id, prompt.drift
    if req.stream:
        gens = [serving.route.stream(sample_request(req, i), prompt) for i in range(k)]
        firsts = await asyncio.gather(*(anext(g) for g in gens), return_exceptions=True)
        errors = [as_proxy_error(f) if isinstance(f, BaseException) else None for f in firsts]
        if any(errors):
            for g in gens:
                await g.aclose()
            return error_response(await _fail_all(serving, recs, errors, t0), headers)
        headers["x-harnessrl-calls"] = ",".join(r.id for r in recs)
        return StreamAnswer(_relay(serving, req, ident, recs, wire, firsts, gens, t0, prompt.turn), headers)
    runs = await asyncio.gather(*(serving.route.run(sample_request(req, i), prompt) for i in range(k)),
                                return_exceptions=True)
    errors = [as_proxy_error(r) if isinstance(r, BaseException) else None for r in runs]
    results: list[Result] = [r for r in runs if isinstance(r, Result)]
    datas: list[dict] = []
    if not any(errors):
        try:
            datas = [wire.response(r) for r in results]
        except Exception as exc:  # noqa: BLE001
            errors = [as_proxy_error(exc)] * k
    if any(errors):
        return error_response(await _fail_all(serving, recs, errors, t0), headers)
    for rec, r, data in zip(recs, results, datas):
        serving.fill(rec, r, data, t0)
    chosen = _best(results, req.n)
    for i, rec in enumerate(recs):
        if i not in chosen:
            rec.status, rec.error = "discarded", f"best_of={k}: not among the n={req.n} most likely samples"
    try:
        await _commit_all(serving, recs)
    except ProxyError as err:
        return error_response(err, headers)
    for i in chosen:
        serving.remember(recs[i], ident, req, results[i], prompt.turn)
    headers["x-harnessrl-call"] = recs[chosen[0]].id
    headers["x-harnessrl-calls"] = ",".join(recs[i].id for i in chosen)
    body = merge_responses([datas[i] for i in chosen], [r.usage for r in results])
    return Response(orjson.dumps(body), 200, headers, "application/json")


def _best(results: list[Result], n: int) -> list[int]:
    """Indices of the n samples to return, in sample order (all of them unless best_of > n)."""
    if len(results) == n:
        return list(range(n))
    score = [sum(r.logprobs or ()) for r in results]
    return sorted(sorted(range(len(results)), key=lambda i: -score[i])[:n])


def merge_responses(datas: list[dict], usages: list[dict | None]) -> dict:
    """One OpenAI response with a choice per sample; usage counts every token sampled (the
    prompt once, as OpenAI does)."""
    body = dict(datas[0])
    body["choices"] = [{**d["choices"][0], "index": i} for i, d in enumerate(datas)]
    body["usage"] = merged_usage(usages)
    return body


def merged_usage(usages: list[dict | None]) -> dict | None:
    if not usages or usages[0] is None:
        return None
    prompt = int(usages[0].get("prompt_tokens") or 0)
    completion = sum(int((u or {}).get("completion_tokens") or 0) for u in usages)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _fail_all(serving: Serving, recs: list[CallRecord], errors: list[ProxyError | None],
                    t0: float) -> ProxyError:
    """Record every sample as failed (the harness sees none); the error to answer."""
    first = next(e for e in errors if e is not None)
    for i, (rec, err) in enumerate(zip(recs, errors)):
        rec.status = "error"
        rec.error = (f"{err.status} {err.type}: {err.message}" if err is not None
                     else f"not returned: a sibling sample failed ({first.status} {first.type})")
        rec.latency_ms = (time.perf_counter() - t0) * 1e3
    try:
        await _commit_all(serving, recs)
    except ProxyError as commit_err:
        return commit_err
    return first


async def _commit_all(serving: Serving, recs: list[CallRecord]) -> None:
    outcomes = await asyncio.gather(*(serving.commit(r) for r in recs), return_exceptions=True)
    for o in outcomes:
        if isinstance(o, BaseException):
            raise as_proxy_error(o)


async def _relay(serving: Serving, req: Request, ident: Identity, recs: list[CallRecord], wire: Wire,
                 firsts: list, gens: list[AsyncGenerator], t0: float, parent: Turn | None) -> AsyncIterator[bytes]:
    """Interleave the samples' deltas as they come (each tagged with its choice index); hold each
    choice's terminal deltas, and one merged usage chunk, until every sample is recorded."""
    queue: asyncio.Queue = asyncio.Queue()
    pumps = [asyncio.create_task(_pump(i, first, gen, queue)) for i, (first, gen) in enumerate(zip(firsts, gens))]
    results: list[Result | None] = [None] * len(gens)
    holding = [False] * len(gens)
    held: list[Delta] = []
    try:
        try:
            while any(r is None for r in results):
                i, item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Result):
                    results[i] = item
                    serving.fill(recs[i], item, wire.response(item), t0)
                    continue
                ready = []
                for d in item:
                    if d.usage is not None and not _has_choices(d):
                        continue  # a sample's own usage: one merged usage chunk goes out at the end
                    _tag(d, i)
                    holding[i] = holding[i] or d.terminal
                    (held if holding[i] else ready).append(d)
                if ready:
                    yield wire.chunks(ready)
        except Exception as exc:  # noqa: BLE001 - recorded; the stream ends with the error
            err = as_proxy_error(exc)
            yield wire.error(await _fail_all(serving, recs, [err] * len(recs), t0))
            return
    finally:  # a harness that hung up stops the model too
        for p in pumps:
            p.cancel()
        for g in gens:
            await g.aclose()
    try:
        await _commit_all(serving, recs)
    except ProxyError as err:
        yield wire.error(err)
        return
    done = [r for r in results if r is not None]
    if req.include_usage:
        held.append(Delta(usage=merged_usage([r.usage for r in done]), terminal=True))
    yield Last((wire.chunks(held) if held else b"") + wire.close(done[0]))
    for rec, r in zip(recs, done):
        serving.remember(rec, ident, req, r, parent)


async def _pump(i: int, first, gen: AsyncGenerator, queue: asyncio.Queue) -> None:
    item = first
    try:
        while True:
            await queue.put((i, item))
            if isinstance(item, Result):
                return
            item = await anext(gen, None)
            if item is None:
                raise RuntimeError("the model stream ended without a result")
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - handed to the relay, which records it
        await queue.put((i, exc))


def _has_choices(d: Delta) -> bool:
    return bool(d.raw.get("choices")) if d.raw is not None else False


def _tag(d: Delta, i: int) -> None:
    d.index = i
    if d.raw is not None:
        for ch in d.raw.get("choices") or []:
            ch["index"] = i


def _key(ident: Identity) -> tuple:
    return (ident.rollout, ident.agent, ident.session)
