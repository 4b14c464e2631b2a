"""Call ids: unique, unguessable, and in creation order (so the `calls` primary-key index grows
at its right edge; bench/record_cost.py measures what that saves)."""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.record.call_rows import new_call_id
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call


@pytest.mark.unit
def test_call_ids_are_unique_hex_and_sort_in_creation_order():
    ids = [new_call_id() for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    # the clock half never goes back; equal clock readings are told apart by the random half
    stamps = [int(i[:16], 16) for i in ids]
    assert stamps == sorted(stamps)
    assert abs(stamps[-1] - time.time_ns()) < 60e9
    assert len({i[16:] for i in ids}) == len(ids)


def test_proxy_call_ids_follow_the_order_of_the_calls(tmp_path, upstream):
    db = str(tmp_path / "runs.db")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        ids = [httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=30).headers["x-harnessrl-call"]
               for _ in range(5)]
        ids.append(httpx.post(proxy.url + "/v1/chat/completions", json={**body, "n": 2},
                              timeout=30).headers["x-harnessrl-call"])
    engine, Session = open_db(db)
    with Session() as s:
        stored = set(s.scalars(select(Call.id)))
    engine.dispose()
    assert ids == sorted(ids) and len(set(ids)) == 6
    (second,) = stored - set(ids)  # the n=2 call's second sample, made after the first
    assert sorted(stored) == ids + [second]
