"""Identity, the rollout API and harnessrl.client, API keys, bad inputs and concurrency —
real proxy, real sockets, openai SDK, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from sqlalchemy import func, select

from harnessrl.client import HarnessRL, HarnessRLError
from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, Reward, Rollout, WeightVersion


MSG = [{"role": "user", "content": "hello"}]


def _session(db: str):
    engine, Session = open_db(db)
    return engine, Session()


def _count(db: str, model=Call) -> int:
    engine, s = _session(db)
    with s:
        n = s.scalar(select(func.count()).select_from(model))
    engine.dispose()
    return n


def test_identity_from_path_headers_and_api_key(upstream, db_target):
    with run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0)) as proxy:
        hrl = HarnessRL(proxy.url)
        ro = hrl.create_rollout(task_id="t1")
        by_path = openai.OpenAI(base_url=ro.base_url("planner"), api_key="ignored", max_retries=0)
        by_path.chat.completions.create(model="m", messages=MSG)
        by_headers = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0, default_headers={
            "X-HarnessRL-Rollout": ro.id, "X-HarnessRL-Agent": "worker", "X-HarnessRL-Session": "w1",
            "X-HarnessRL-Parent-Call": "p123"})
        by_headers.chat.completions.create(model="m", messages=MSG)
        by_key = openai.OpenAI(base_url=proxy.url + "/v1", api_key=f"hrl-{ro.id}-search-agent", max_retries=0)
        by_key.completions.create(model="m", prompt="hi", max_tokens=2)
        # the path wins over headers
        openai.OpenAI(base_url=ro.base_url("planner"), api_key="x", max_retries=0,
                      default_headers={"X-HarnessRL-Agent": "other"}).chat.completions.create(model="m", messages=MSG)
    engine, s = _session(db_target)
    with s:
        calls = list(s.scalars(select(Call).order_by(Call.seq)))
        for c in calls:
            s.expunge(c)
    engine.dispose()
    assert [c.rollout_id for c in calls] == [ro.id] * 4
    assert [c.seq for c in calls] == [0, 1, 2, 3]
    assert [(c.agent, c.session_id, c.parent_call_id) for c in calls] == [
        ("planner", None, None), ("worker", "w1", "p123"), ("search-agent", None, None), ("planner", None, None)]
    # the API key is never stored
    assert all("hrl-" not in str(c.request) for c in calls)


def test_rollout_api_and_client(upstream, db_target):
    with run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0)) as proxy:
        hrl = HarnessRL(proxy.url)
        with hrl.rollout(task_id="t7", group_id="g1", run="round0", metadata={"k": 1}) as ro:
            client = openai.OpenAI(base_url=ro.base_url("planner"), api_key="x", max_retries=0)
            raw = client.chat.completions.with_raw_response.create(model="m", messages=MSG)
            call_id = raw.headers["x-harnessrl-call"]
            ro.reward(0.75)
            ro.process_reward(call_id, 0.5, name="tool_ok")
        other = hrl.create_rollout(task_id="t8")
        got = hrl.get_rollout(ro.id)
        listed = hrl.list_rollouts(task_id="t7")
        all_rollouts = hrl.list_rollouts()
        with pytest.raises(HarnessRLError, match="404"):
            hrl.process_reward("no-such-call", 1.0)
        with pytest.raises(HarnessRLError, match="404"):
            hrl.get_rollout("nope")
        # a finished rollout takes no more calls
        with pytest.raises(openai.APIStatusError, match="410"):
            client.chat.completions.create(model="m", messages=MSG)
    assert got["status"] == "finished" and got["task_id"] == "t7" and got["metadata"] == {"k": 1}
    assert [c["id"] for c in got["calls"]] == [call_id] and "prompt_ids" not in got["calls"][0]
    assert sorted((r["kind"], r["name"], r["value"], r["call_id"]) for r in got["rewards"]) == [
        ("outcome", "outcome", 0.75, None), ("process", "tool_ok", 0.5, call_id)]
    assert [r["id"] for r in listed] == [ro.id]
    assert {r["id"] for r in all_rollouts} >= {ro.id, other.id}
    assert _count(db_target, Reward) == 2


def test_api_key_is_required_when_set(upstream, tmp_path):
    db = str(tmp_path / "k.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0, api_key="s3cret")) as proxy:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=proxy.url + "/v1", api_key="wrong", max_retries=0).chat.completions.create(
                model="m", messages=MSG)
        r = httpx.post(proxy.url + "/harnessrl/rollouts", json={})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        hrl = HarnessRL(proxy.url, api_key="s3cret")
        ro = hrl.create_rollout()
        openai.OpenAI(base_url=ro.base_url("a"), api_key="s3cret", max_retries=0).chat.completions.create(
            model="m", messages=MSG)
        openai.OpenAI(base_url=proxy.url + "/v1", api_key=f"hrl-{ro.id}-b:s3cret", max_retries=0).chat.completions.create(
            model="m", messages=MSG)
    engine, s = _session(db)
    with s:
        agents = list(s.scalars(select(Call.agent).order_by(Call.seq)))
        stored = " ".join(str(c.request) + str(c.response) for c in s.scalars(select(Call)))
    engine.dispose()
    assert agents == ["a", "b"] and "s3cret" not in stored


def _post(url: str, content: bytes, headers: dict | None = None) -> httpx.Response:
    return httpx.post(url, content=content, headers={"content-type": "application/json", **(headers or {})})


def test_bad_inputs_get_openai_errors_and_only_refused_calls_are_recorded(upstream, db_target):
    with run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0, max_body_bytes=4096, strict_rollouts=True)) as proxy:
        chat = proxy.url + "/v1/chat/completions"
        cases = [
            (_post(chat, b"{not json"), 400, "invalid_json"),
            (_post(chat, b"[1, 2]"), 400, "invalid_json"),
            (_post(chat, b'{"model": "m", "messages": "hello"}'), 400, "invalid_type"),
            (_post(chat, b'{"model": "m", "messages": [{"content": "no role"}]}'), 400, "invalid_type"),
            (_post(chat, b'{"model": "m", "messages": [{"role": "user", "content": 5}]}'), 400, "invalid_type"),
            (_post(chat, b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}'),
             400, "invalid_type"),
            (_post(chat, b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}'), 400,
             "invalid_type"),
            (_post(chat, b'{"model": 3, "messages": [{"role": "user", "content": "x"}]}'), 400, "invalid_type"),
            (_post(proxy.url + "/v1/completions", b'{"model": "m", "prompt": [1, "a"]}'), 400, "invalid_type"),
            (_post(chat, b'{"messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}'), 413,
             "body_too_large"),
            (_post(proxy.url + "/r/nosuchrollout/a/p/v1/chat/completions",
                   b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}'), 404, "rollout_not_found"),
            (_post(chat, b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}',
                   {"X-HarnessRL-Rollout": "r" * 80}), 400, "identity_too_long"),
            (_post(proxy.url + "/harnessrl/rollouts/x/reward", b'{"value": "high"}'), 400, "invalid_type"),
            (_post(proxy.url + "/harnessrl/rollouts", b"{oops"), 400, "invalid_json"),
            (_post(proxy.url + "/harnessrl/rollouts/nope/reward", b'{"value": 1}'), 404, "rollout_not_found"),
            (_post(proxy.url + "/harnessrl/weights", b'{"path": "/tmp/x"}'), 400, "reload_unsupported"),
            (httpx.get(proxy.url + "/nowhere"), 404, None),
        ]
        for resp, status, code in cases:
            assert resp.status_code == status, resp.text
            err = resp.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"]
            assert err["code"] == code, resp.text
    engine, s = _session(db_target)
    with s:
        rows = list(s.scalars(select(Call).order_by(Call.seq)))
        rollouts = list(s.scalars(select(Rollout)))
    engine.dispose()
    # each refused model call of a running rollout (here the unassigned one) is a failed call in it;
    # an unknown rollout (--strict-rollouts) or a malformed id gets none, and no rollout either
    assert [(r.rollout_id, r.status, r.error.split(":")[0]) for r in rows] == \
        [("unassigned", "error", "400 invalid_request_error")] * 9 + [("unassigned", "error", "413 invalid_request_error")]
    assert [r.surface for r in rows] == ["chat"] * 8 + ["completions", "chat"]
    assert rows[2].request == {"model": "m", "messages": "hello"} and rows[0].request == {}
    assert [(r.id, r.errors) for r in rollouts] == [("unassigned", 10)]
    assert _count(db_target, Reward) == 0


def test_weights_endpoint_uses_the_reload_hook(upstream, tmp_path):
    db = str(tmp_path / "w.db")
    seen = []

    def hook(path: str, version: str | None) -> str:
        seen.append(path)
        return version or "v-from-hook"

    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0, reload_hook=hook)) as proxy:
        assert HarnessRL(proxy.url).push_weights("/ckpt/1") == "v-from-hook"
        assert HarnessRL(proxy.url).push_weights("/ckpt/2", version="step2") == "step2"
    assert seen == ["/ckpt/1", "/ckpt/2"] and _count(db, WeightVersion) == 2


def test_concurrent_clients_lose_and_duplicate_nothing(upstream, db_target):
    n_clients, per_client, n_rollouts = 32, 3, 4
    with run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0)) as proxy:
        hrl = HarnessRL(proxy.url)
        rollouts = [hrl.create_rollout(task_id=f"t{i}") for i in range(n_rollouts)]

        async def client(k: int) -> list[str]:
            ro = rollouts[k % n_rollouts]
            c = openai.AsyncOpenAI(base_url=ro.base_url(f"agent{k}"), api_key="x", max_retries=0)
            ids = []
            for j in range(per_client):
                raw = await c.chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": f"q {k} {j}"}], stream=(j % 2 == 1))
                ids.append(raw.headers["x-harnessrl-call"])
                if j % 2 == 1:
                    async for _ in raw.parse():
                        pass
            await c.close()
            return ids

        async def main() -> list[list[str]]:
            return await asyncio.gather(*(client(k) for k in range(n_clients)))

        per_client_ids = asyncio.run(main())
    got = [i for ids in per_client_ids for i in ids]
    engine, s = _session(db_target)
    with s:
        rows = s.execute(select(Call.id, Call.rollout_id, Call.seq, Call.agent, Call.status)).all()
    engine.dispose()
    assert len(got) == len(set(got)) == n_clients * per_client
    assert sorted(r.id for r in rows) == sorted(got)
    assert all(r.status == "ok" for r in rows)
    for ro in rollouts:
        seqs = sorted(r.seq for r in rows if r.rollout_id == ro.id)
        assert seqs == list(range(n_clients // n_rollouts * per_client))  # 0..n-1, no gap, no repeat
    # each client made its calls one after another: their seqs strictly increase in that order
    seq_of = {r.id: r.seq for r in rows}
    for ids in per_client_ids:
        mine = [seq_of[i] for i in ids]
        assert all(a < b for a, b in zip(mine, mine[1:]))
