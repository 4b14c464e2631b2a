"""Streams (issue 12, defect 8): a stream the harness abandons is recorded as `cancelled` with the
tokens generated until then, and the local backend stops generating; an upstream answer without
choices is an upstream error (502, recorded as failed), not an empty success."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, unpack_ids, unpack_logprobs

MSG = [{"role": "user", "content": "Tell me a long story."}]
LONG = 60


def _rows(db: str) -> list[Call]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(Call).order_by(Call.seq)))
    engine.dispose()
    return rows


def _until(db: str, n: int) -> list[Call]:
    """The call rows once there are `n` (an abandoned stream is recorded without anyone waiting)."""
    for _ in range(400):
        rows = _rows(db)
        if len(rows) >= n:
            return rows
        time.sleep(0.05)
    raise AssertionError(f"expected {n} call rows, have {len(rows)}")


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    b = LocalBackend(tiny_model_dir, seed=0)
    yield b
    b.close()


def test_an_abandoned_stream_is_recorded_cancelled_and_the_local_model_stops(backend, tiny_model_dir, tmp_path):
    db = str(tmp_path / "r.db")
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0), backend=backend) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
        # a seed whose answer runs to max_tokens: the full generation is known to be LONG tokens
        for seed in range(30):
            full = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=LONG, seed=seed,
                                                  temperature=2.0)
            if full.choices[0].finish_reason == "length":
                break
        else:
            pytest.fail("no seed in 30 gave a generation that runs to max_tokens")
        before = backend.generated_tokens
        stream = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=LONG, seed=seed,
                                                temperature=2.0, stream=True)
        it = iter(stream)
        got = [next(it), next(it)]
        stream.close()
        # the model is free again; had the abandoned generation run on, it would have made LONG tokens first
        client.chat.completions.create(model="tiny", messages=MSG, max_tokens=1)
        generated = backend.generated_tokens - before
        rows = _until(db, 3 + seed)
    assert got[0].choices[0].delta.role == "assistant"
    full_row, cancelled = rows[-3], next(r for r in rows if r.status == "cancelled")
    assert cancelled.stream and cancelled.error and cancelled.finish_reason is None
    ids = unpack_ids(cancelled.completion_ids).tolist()
    full_ids = unpack_ids(full_row.completion_ids).tolist()
    # the tokens generated before the harness left: the very ones the same seed gives
    assert 1 <= len(ids) < LONG and ids == full_ids[: len(ids)]
    assert len(unpack_logprobs(cancelled.completion_logprobs)) == len(ids) == cancelled.completion_tokens
    assert unpack_ids(cancelled.prompt_ids).tolist() == unpack_ids(full_row.prompt_ids).tolist()
    assert cancelled.response_text and full_row.response_text.startswith(cancelled.response_text[:5])
    assert generated < LONG  # the generation stopped
    assert rows[-1].status == "ok"  # the call after it


def test_an_upstream_answer_without_choices_is_a_502_recorded_as_failed(upstream, tmp_path):
    db = str(tmp_path / "r.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        body = {"model": "no-choices", "messages": MSG}
        plain = httpx.post(proxy.url + "/v1/chat/completions", json=body)
        streamed = httpx.post(proxy.url + "/v1/chat/completions", json={**body, "stream": True})
    for resp in (plain, streamed):
        assert resp.status_code == 502, resp.text
        # an error object answered with status 200: the upstream's own words (issue 30)
        assert resp.json()["error"]["code"] == "upstream_error" and "overloaded" in resp.json()["error"]["message"]
    rows = _rows(db)
    assert [(r.status, r.stream) for r in rows] == [("error", False), ("error", True)]
    assert all(r.error.startswith("502 upstream_error: the upstream sent an error: overloaded") for r in rows)


def test_an_abandoned_upstream_stream_is_recorded_cancelled(upstream, tmp_path):
    db = str(tmp_path / "r.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
        stream = client.chat.completions.create(model="slow-stream", messages=MSG, max_tokens=400, stream=True)
        it = iter(stream)
        next(it), next(it)
        stream.close()
        (row,) = _until(db, 1)
    assert row.status == "cancelled" and row.stream
    assert len(unpack_ids(row.completion_ids)) >= 1 and unpack_ids(row.prompt_ids) is not None
