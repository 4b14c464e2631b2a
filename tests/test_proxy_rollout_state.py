"""Rollout state across proxies and locks (issue 12, defects 5 and 6; issue 10, identity without a
set-up call): a locked rollout row stalls only its own calls, a rollout finished through one
proxy takes no more calls or rewards through another, unknown rollout ids are created on first
use unless --strict-rollouts, and clients may choose rollout ids."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import psycopg
import pytest
from sqlalchemy import select

from harnessrl.client import HarnessRL
from harnessrl.db import open_db
from harnessrl.proxy.rollouts.store import Rollouts
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.proxy.rollouts.status import RolloutStatus
from harnessrl.records import Call, Rollout

MSG = [{"role": "user", "content": "hello"}]


def _chat(url: str, rollout: str, **kw) -> httpx.Response:
    return httpx.post(f"{url}/r/{rollout}/a/solver/v1/chat/completions",
                      json={"model": "m", "messages": MSG, "max_tokens": 4, **kw}, timeout=60)


def _pg(pg_url: str) -> psycopg.Connection:
    schema = pg_url.rsplit("search_path%3D", 1)[1]
    return psycopg.connect(f"host=127.0.0.1 port=5432 user=postgres dbname=test options='-csearch_path={schema}'")


def _calls(db: str) -> list[Call]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(Call).order_by(Call.rollout_id, Call.seq)))
    engine.dispose()
    return rows


def test_a_locked_rollout_row_stalls_only_its_own_calls(upstream, pg_url):
    with run_proxy(ProxyConfig(db=pg_url, upstream=upstream, port=0, db_lock_timeout_s=120)) as proxy:
        client = HarnessRL(proxy.url)
        locked, *others = [client.create_rollout().id for _ in range(4)]
        with _pg(pg_url) as holder, ThreadPoolExecutor(1) as pool:
            holder.execute("SELECT id FROM rollouts WHERE id = %s FOR UPDATE", (locked,))
            waiting = pool.submit(_chat, proxy.url, locked)
            # the other rollouts commit while the lock is held (before the fix: all waited for it)
            for rid in others:
                assert _chat(proxy.url, rid).status_code == 200
            assert not waiting.done()  # still held: the locked rollout's call waits for its row
            holder.rollback()  # releases the row lock
            assert waiting.result(timeout=60).status_code == 200
    rows = _calls(pg_url)
    assert sorted(r.rollout_id for r in rows) == sorted([locked, *others])
    assert all(r.status == "ok" and r.seq == 0 for r in rows)


def test_a_rollout_row_locked_too_long_gets_a_retryable_503_and_a_failed_call_row(upstream, pg_url):
    with run_proxy(ProxyConfig(db=pg_url, upstream=upstream, port=0, db_lock_timeout_s=0.3)) as proxy:
        rid = HarnessRL(proxy.url).create_rollout().id
        with _pg(pg_url) as holder:
            holder.execute("SELECT id FROM rollouts WHERE id = %s FOR UPDATE", (rid,))
            busy = _chat(proxy.url, rid)
            assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["code"] == "database_unavailable"
            assert "locked" in busy.json()["error"]["message"]
            holder.rollback()
        assert _chat(proxy.url, rid).status_code == 200  # the retry goes through
        # the 503 is recorded as a failed call once the row is free (the writer keeps it waiting)
        for _ in range(200):
            rows = _calls(pg_url)
            if len(rows) == 2:
                break
            asyncio.run(asyncio.sleep(0.05))
    assert sorted(r.status for r in rows) == ["error", "ok"]
    failed = next(r for r in rows if r.status == "error")
    assert failed.id == busy.headers["x-harnessrl-call"] and failed.error.startswith("503")


def test_a_rollout_finished_through_one_proxy_takes_no_calls_or_rewards_through_another(upstream, pg_url):
    with run_proxy(ProxyConfig(db=pg_url, upstream=upstream, port=0)) as a, \
            run_proxy(ProxyConfig(db=pg_url, upstream=upstream, port=0)) as b:
        ro = HarnessRL(a.url).create_rollout(task_id="t1")
        assert _chat(b.url, ro.id).status_code == 200  # B now knows the rollout as running
        ro.finish()  # through A
        late = _chat(b.url, ro.id)
        assert late.status_code == 410 and late.json()["error"]["code"] == "rollout_finished"
        again = _chat(b.url, ro.id, stream=True)  # B has learnt it: refused before the model runs
        assert again.status_code == 410 and again.json()["error"]["code"] == "rollout_finished"
        for path in (f"/harnessrl/rollouts/{ro.id}/reward", f"/harnessrl/calls/{late.headers['x-harnessrl-call']}/reward"):
            reward = httpx.post(b.url + path, json={"value": 1.0})
            assert reward.status_code == 409 and reward.json()["error"]["code"] == "rollout_finished"
        got = httpx.get(f"{a.url}/harnessrl/rollouts/{ro.id}").json()
    assert got["rewards"] == []
    # the late call left a failed-call row (it had run the model); the refused one left none
    assert [(c["status"], c["error"].split(":")[0] if c["error"] else None) for c in got["calls"]] == [
        ("ok", None), ("error", "410 invalid_request_error")]
    assert got["calls"][1]["id"] == late.headers["x-harnessrl-call"]


@pytest.mark.parametrize("how", ["path", "header", "key"])
def test_an_unknown_rollout_id_is_created_on_first_use(upstream, tmp_path, how):
    db = str(tmp_path / "r.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        if how == "path":
            client = openai.OpenAI(base_url=f"{proxy.url}/r/ext_run.7/a/solver/v1", api_key="x", max_retries=0)
        elif how == "header":
            client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0,
                                   default_headers={"X-HarnessRL-Rollout": "ext_run.7", "X-HarnessRL-Agent": "solver"})
        else:
            client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="hrl-ext_run.7-solver", max_retries=0)
        client.chat.completions.create(model="m", messages=MSG, max_tokens=4)
        client.chat.completions.create(model="m", messages=MSG, max_tokens=4)
        got = httpx.get(proxy.url + "/harnessrl/rollouts/ext_run.7").json()
    assert got["status"] == "running" and got["task_id"] is None
    assert [(c["agent"], c["seq"], c["status"]) for c in got["calls"]] == [("solver", 0, "ok"), ("solver", 1, "ok")]


def test_strict_rollouts_refuse_unknown_ids(upstream, tmp_path):
    db = str(tmp_path / "r.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0, strict_rollouts=True)) as proxy:
        refused = _chat(proxy.url, "nosuch")
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "rollout_not_found"
        assert "--strict-rollouts" in refused.json()["error"]["message"]
    engine, Session = open_db(db)
    with Session() as s:
        assert s.get(Rollout, "nosuch") is None and not list(s.scalars(select(Call)))
    engine.dispose()


def test_a_client_chosen_rollout_id(upstream, tmp_path):
    with run_proxy(ProxyConfig(db=str(tmp_path / "r.db"), upstream=upstream, port=0, strict_rollouts=True)) as proxy:
        made = httpx.post(proxy.url + "/harnessrl/rollouts", json={"id": "job-42.a", "task_id": "t"})
        assert made.status_code == 200 and made.json()["id"] == "job-42.a"
        assert made.json()["base_url_template"].endswith("/r/job-42.a/a/{agent}/v1")
        assert _chat(proxy.url, "job-42.a").status_code == 200
        taken = httpx.post(proxy.url + "/harnessrl/rollouts", json={"id": "job-42.a"})
        assert taken.status_code == 409 and taken.json()["error"]["code"] == "rollout_exists"
        for bad, code in (("a b", "invalid_identity"), ("x" * 65, "identity_too_long"), ("nul\u0000", "invalid_identity")):
            resp = httpx.post(proxy.url + "/harnessrl/rollouts", json={"id": bad})
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["code"] == code and resp.json()["error"]["param"] == "id"


def test_the_rollout_status_cache_is_bounded(tmp_path):
    engine, Session = open_db(str(tmp_path / "r.db"))
    statuses = RolloutStatus(Rollouts(Session), strict=False, max_entries=5)

    async def use(ids):
        for rid in ids:
            await statuses.check(rid)

    asyncio.run(use([f"r{i}" for i in range(50)]))
    assert len(statuses) == 5
    with Session() as s:  # every id was created, though only the latest are cached
        assert len(list(s.scalars(select(Rollout.id)))) == 50
    engine.dispose()
