"""The upstream probes of the fault campaign (bench/faults.py): errors the upstream answers (500,
malformed ids, usage or chunks, an upstream that is not there), and answers that end as if
complete but are not (issue 30): vLLM's error event mid-stream, a body that is not SSE, an HTML
page, a cut event, no finish reason — in pass-through and `--prefix` mode, on the chat,
completions and Anthropic surfaces, streamed or not. Each must leave a failed call (never one
recorded `ok`) and tell the harness (an error status, or a started stream ending with an error
event rather than `[DONE]` / `message_stop`)."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_common import HANG_S, MSGS, Probe, openai_error, proxy, recorded  # noqa: E402
from procs import free_port, stop  # noqa: E402


def upstream_faults(upstream: str, tmp: Path) -> Probe:
    p = Probe("upstream faults (500, bad ids/usage/chunk, dead upstream)", recorded_ok=0)
    # the stand-in's fault hooks (tests/vllm_standin.py): what each breaks, streamed or not
    cases = [(upstream, "fail-500", False), (upstream, "fail-500", True), (upstream, "bad-ids", False),
             (upstream, "bad-usage", False), (upstream, "bad-chunk", True)]
    dead = f"http://127.0.0.1:{free_port()}"
    cases += [(dead, "m", False), (dead, "m", True)]
    for target in (upstream, dead):
        db = str(tmp / f"up-{free_port()}.db")
        proc, url = proxy(target, db)
        ids = []
        try:
            for _ in range(10):
                for t, model, stream in cases:
                    if t != target:
                        continue
                    p.tried += 1
                    try:
                        r = httpx.post(url + "/v1/chat/completions", timeout=HANG_S,
                                       json={"model": model, "messages": MSGS, "stream": stream})
                    except httpx.TimeoutException:
                        p.hangs += 1
                        continue
                    ids.append((r.headers.get("x-harnessrl-call"), _told(r, "chat", stream)))
        finally:
            stop(proc)
        _score(p, ids, recorded(db))
    return p


# answers that end as if complete but are not (issue 30); the stand-in breaks the answer of a
# prompt holding "[fault:NAME]", so a --prefix proxy (which names the served model) gets them too
INCOMPLETE = ("error-mid-stream", "no-finish", "abort", "non-sse", "garbage", "truncated-json")


def _ask(http: httpx.Client, surface: str, fault: str, stream: bool) -> httpx.Response:
    text = f"Say it [fault:{fault}] please"
    if surface == "chat":
        return http.post("/v1/chat/completions", json={"model": "m", "stream": stream,
                                                       "messages": [{"role": "user", "content": text}]})
    if surface == "completions":
        return http.post("/v1/completions", json={"model": "m", "stream": stream, "prompt": text, "max_tokens": 40})
    return http.post("/v1/messages", headers={"anthropic-version": "2023-06-01"}, json={
        "model": "m", "stream": stream, "max_tokens": 40, "messages": [{"role": "user", "content": text}]})


def _told(r: httpx.Response, surface: str, stream: bool) -> bool:
    """Whether the harness learned the call failed: an error status with the surface's error
    body, or a stream that started and ends with the surface's error event (never with [DONE] or
    message_stop, which say the answer is whole)."""
    if r.status_code != 200:
        if surface == "messages":
            try:
                return r.json()["type"] == "error" and isinstance(r.json()["error"], dict)
            except Exception:  # noqa: BLE001 - not JSON, not an object
                return False
        return openai_error(r)
    if not stream:
        return False
    last = r.text.strip().rsplit("\n\n", 1)[-1]
    if surface == "messages":
        return last.startswith("event: error\n") and "message_stop" not in r.text
    return last.startswith('data: {"error":') and "data: [DONE]" not in r.text


def _score(p: Probe, ids: list, stored: dict) -> None:
    for call_id, told in ids:
        status = stored.get(call_id)
        p.well += status == "error" and told
        p.lost += status is None
        p.recorded_ok += status == "ok"  # type: ignore[operator]


def incomplete_answers(upstream: str, tmp: Path, mode: str, repeats: int = 4) -> Probe:
    p = Probe(f"upstream answers that end as if complete ({mode})", recorded_ok=0)
    db = str(tmp / f"incomplete-{mode}.db")
    extra = ("--prefix", "--tokenizer", str(tmp / "tok")) if mode == "--prefix" else ()
    proc, url = proxy(upstream, db, *extra)
    ids = []
    try:
        with httpx.Client(base_url=url, timeout=HANG_S) as http:
            for _ in range(repeats):
                for fault in INCOMPLETE:
                    for surface in ("chat", "completions", "messages"):
                        for stream in (False, True):
                            p.tried += 1
                            try:
                                r = _ask(http, surface, fault, stream)
                            except httpx.TimeoutException:
                                p.hangs += 1
                                continue
                            ids.append((r.headers.get("x-harnessrl-call"), _told(r, surface, stream)))
    finally:
        stop(proc)
    _score(p, ids, recorded(db))
    p.note = f"{len(INCOMPLETE)} shapes x chat/completions/messages x stream or not"
    return p
