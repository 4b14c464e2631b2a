"""The event loop stays free while a large body is rendered and tokenized (issue 30: one 30.9 MiB
chat body froze the whole proxy for 59.5 s; `/health` waited 57.5 s).

Tests assert no timings for performance; this is a liveness property. It is asserted so that a
loaded 2-core machine cannot fail it by chance: the body is the largest the proxy takes (its body
limit lowered to 2 MiB, so tokenizing it takes seconds, not a minute), and what must hold is that
`/health` kept answering *while that call was still in flight* — at least 5 times, with a median
under 100 ms and none waiting half the call's time. Before the fix the probe sent once
tokenization had begun waited for all of it (1.7 s of 1.7 s here), and at most 4 answered in
flight. A median rather than a maximum under 100 ms: on a shared machine one probe may lose its
core to another process for a moment; the liveness is what is asserted."""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest
from raw_upstream import http_response, raw_upstream

from harnessrl.proxy.server import ProxyConfig, run_proxy

LIMIT = 2 * 1024 * 1024


def _maximal_body(max_tokens: bool = False) -> bytes:
    words = "alpha beta gamma delta paris river engine answer "
    head = b'{"model": "m", ' + (b'"max_tokens": 5, ' if max_tokens else b"") + b'"messages": [{"role": "user", "content": "'
    tail = b'"}]}'
    return head + (words * (LIMIT // len(words)))[: LIMIT - len(head) - len(tail)].encode() + tail


def _probe_while(url: str, body: bytes, path: str = "/v1/chat/completions") -> tuple[httpx.Response, list[float], float]:
    """The big call's answer, the latencies of the /health probes answered while it was in
    flight, and how long it took."""
    answer: list[httpx.Response] = []
    done = threading.Event()

    def big() -> None:
        try:
            answer.append(httpx.post(url + path, content=body, timeout=600,
                                     headers={"content-type": "application/json"}))
        finally:
            done.set()

    in_flight: list[float] = []
    with httpx.Client(base_url=url, timeout=600) as http:
        http.get("/health")  # a connection of its own, open before the big call
        t0 = time.perf_counter()
        threading.Thread(target=big, daemon=True).start()
        while not done.is_set():
            t = time.perf_counter()
            assert http.get("/health").status_code == 200
            if not done.is_set():
                in_flight.append(time.perf_counter() - t)
            time.sleep(0.02)
    return answer[0], in_flight, time.perf_counter() - t0


# what vLLM answers a prompt longer than its context, at once: the call's time is the proxy's own
TOO_LONG = http_response(b'{"error": {"message": "This model\'s maximum context length is 4096 tokens", '
                         b'"type": "BadRequestError", "param": null, "code": 400}}', "application/json", "400 Bad Request")


@pytest.mark.parametrize("mode", ["local", "prefix"])
def test_health_answers_while_a_maximal_body_is_tokenized(mode, tiny_model_dir, tokenizer_dir, tmp_path):
    body = _maximal_body()
    assert LIMIT - 64 < len(body) <= LIMIT
    with raw_upstream() as up:
        up.reply = TOO_LONG
        if mode == "local":  # the tiny model's context is far shorter: tokenized, then refused
            cfg = ProxyConfig(db=str(tmp_path / "runs.db"), backend="local", model=str(tiny_model_dir), port=0,
                              max_body_bytes=LIMIT)
        else:
            cfg = ProxyConfig(db=str(tmp_path / "runs.db"), upstream=up.url, port=0, prefix=True,
                              tokenizer=str(tokenizer_dir), max_body_bytes=LIMIT)
        with run_proxy(cfg) as proxy:
            r, in_flight, took = _probe_while(proxy.url, body)
    assert r.status_code == 400 and "maximum context length is" in r.json()["error"]["message"]
    _assert_live(mode, in_flight, took)


def test_health_answers_while_count_tokens_renders_a_maximal_body(tokenizer_dir, tmp_path):
    body = _maximal_body(max_tokens=True)
    with raw_upstream() as up:
        cfg = ProxyConfig(db=str(tmp_path / "runs.db"), upstream=up.url, port=0, prefix=True,
                          tokenizer=str(tokenizer_dir), max_body_bytes=LIMIT)
        with run_proxy(cfg) as proxy:
            r, in_flight, took = _probe_while(proxy.url, body, "/v1/messages/count_tokens")
    assert r.status_code == 200 and r.json()["input_tokens"] > LIMIT // 10
    _assert_live("count_tokens", in_flight, took)


def _assert_live(mode: str, in_flight: list[float], took: float) -> None:
    print(f"{mode}: {len(in_flight)} /health answers in flight over {took:.2f} s; median "
          f"{statistics.median(in_flight or [0]) * 1e3:.1f} ms, max {max(in_flight or [0]) * 1e3:.1f} ms")
    assert len(in_flight) >= 5, f"/health answered {len(in_flight)} times in {took:.1f} s of processing"
    # none waited for the processing (before: one waited ~all of it, the others came before it began)
    assert statistics.median(in_flight) < 0.1 and max(in_flight) < took / 2, sorted(in_flight)


def test_prompts_tokenized_at_once_on_several_threads_each_get_their_own_ids(upstream, tokenizer_dir, tmp_path):
    """The route's prompt threads share one tokenizer: 16 calls at once are each recorded with the
    ids a single-threaded rendering gives."""
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy import select
    from transformers import AutoTokenizer

    from harnessrl.db import open_db
    from harnessrl.proxy.prefix.prompts import Prompter
    from harnessrl.records import Call, unpack_ids

    db = str(tmp_path / "runs.db")
    asks = [[{"role": "user", "content": f"question {i}: " + "river " * (50 * i)}] for i in range(16)]
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0, prefix=True, tokenizer=str(tokenizer_dir))) as proxy:
        def ask(messages: list[dict]) -> str:
            r = httpx.post(proxy.url + "/v1/chat/completions", timeout=120,
                           json={"model": "m", "max_tokens": 4, "messages": messages})
            assert r.status_code == 200, r.text
            return r.headers["x-harnessrl-call"]

        with ThreadPoolExecutor(16) as pool:
            ids = list(pool.map(ask, asks))
    prompter = Prompter(AutoTokenizer.from_pretrained(tokenizer_dir), True)
    engine, Session = open_db(db)
    with Session() as s:
        rows = {c.id: c for c in s.scalars(select(Call))}
    engine.dispose()
    for call_id, messages in zip(ids, asks):
        assert list(unpack_ids(rows[call_id].prompt_ids)) == prompter.render(messages, None)
