"""Several upstreams behind one proxy: three vLLM stand-ins on real sockets, the openai SDK as
the harness. Sessions stay on their upstream (the one the hash ring names), a stopped upstream
is taken out and only its sessions move, it is probed back in when it answers again."""

from __future__ import annotations

import time
from contextlib import ExitStack

import httpx
import openai
import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.proxy.upstream.ring import ring_order
from harnessrl.records import Call
from vllm_standin import create_app, run_standin

MSG = [{"role": "user", "content": "Where is the river?"}]


@pytest.mark.unit
def test_ring_removing_an_upstream_moves_only_its_sessions():
    urls = [f"http://10.0.0.{i}:8000" for i in range(1, 4)]
    keys = [("r", "a", f"s{i}") for i in range(3000)]
    before = {k: ring_order(urls, k)[0] for k in keys}
    share = {u: sum(1 for h in before.values() if h == u) / len(keys) for u in urls}
    assert all(0.2 < s < 0.47 for s in share.values()), share  # virtual nodes keep the arcs even
    after = {k: ring_order(urls[:2], k)[0] for k in keys}
    moved = [k for k in keys if after[k] != before[k]]
    assert moved and all(before[k] == urls[2] for k in moved)  # only the removed upstream's sessions
    grown = {k: ring_order([*urls, "http://10.0.0.4:8000"], k)[0] for k in keys}
    gained = [k for k in keys if grown[k] != before[k]]
    assert all(grown[k] == "http://10.0.0.4:8000" for k in gained)  # a new replica only takes sessions
    assert len(gained) < len(keys) / 3
    # the order after the owner is the failover order: the next up upstream clockwise
    assert all(ring_order(urls, k)[1] == after[k] for k in moved)


def _calls(db: str) -> list[Call]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(Call).order_by(Call.created_at)))
    engine.dispose()
    return rows


def _chat(proxy_url: str, session: str, retries: int = 0, model: str = "m", **kw):
    client = openai.OpenAI(base_url=f"{proxy_url}/r/roll/a/agent/v1", api_key="unused", max_retries=retries,
                           default_headers={"x-harnessrl-session": session})
    return client.chat.completions.create(model=model, messages=MSG, **kw)


def test_sessions_stick_and_a_stopped_upstream_moves_only_its_sessions(tokenizer_dir, tmp_path):
    db = str(tmp_path / "runs.db")
    apps = [create_app(str(tokenizer_dir)) for _ in range(3)]
    with ExitStack() as stack:
        stands = [ExitStack() for _ in apps]
        urls = [s.enter_context(run_standin(str(tokenizer_dir), app)) for s, app in zip(stands, apps)]
        for s in stands:
            stack.enter_context(s)
        cfg = ProxyConfig(db=db, upstreams=tuple(urls), port=0, fail_after=2, probe_s=0.1)
        proxy = stack.enter_context(run_proxy(cfg))
        # 12 sessions, 4 homed on each upstream: which names land where depends on the ports (random),
        # so the names are picked, not fixed (s0..s11 put none on one upstream now and then)
        home: dict[str, str] = {}
        for name in (f"s{i}" for i in range(10_000)):
            first = ring_order(urls, ("roll", "agent", name))[0]
            if sum(h == first for h in home.values()) < 4:
                home[name] = first
            if len(home) == 12:
                break
        sessions = list(home)
        assert len(sessions) == 12 and len(set(home.values())) == 3
        for _ in range(2):
            for s in sessions:
                _chat(proxy.url, s)
        by_session: dict[str, set] = {}
        for c in _calls(db):
            by_session.setdefault(c.session_id, set()).add(c.request["harnessrl_upstream"])
        assert by_session == {s: {home[s]} for s in sessions}  # every call of a session on its upstream

        # stop the third upstream mid-run: its sessions fail until it is taken out, then move on
        victim = urls[2]
        stands[2].close()
        moved = [s for s in sessions if home[s] == victim]
        failed = 0
        for s in moved:
            for _ in range(3):
                try:
                    _chat(proxy.url, s)
                except openai.APIStatusError as exc:
                    assert exc.status_code == 502
                    failed += 1
        assert failed == cfg.fail_after  # consecutive failures take it out; later calls go elsewhere
        for s in sessions:
            _chat(proxy.url, s)
        rows = _calls(db)
        after = {}
        for c in rows[-len(sessions):]:
            after[c.session_id] = c.request["harnessrl_upstream"]
        assert {s: after[s] for s in sessions if home[s] != victim} == {s: home[s] for s in sessions
                                                                         if home[s] != victim}
        assert all(after[s] == ring_order(urls, ("roll", "agent", s))[1] for s in moved)
        errors = [c for c in rows if c.status == "error"]
        assert len(errors) == failed and all(c.request["harnessrl_upstream"] == victim for c in errors)
        ready = httpx.get(f"{proxy.url}/ready").json()
        assert {u["url"]: u["state"] for u in ready["upstreams"]}[victim] == "down"
        assert ready["status"] == "ready"  # two of three still take calls
        metrics = httpx.get(f"{proxy.url}/metrics").text
        assert f"harnessrl_upstream_session_moves_total {float(len(moved))}" in metrics

        # the upstream comes back on its port: probed back in, its sessions return to it
        port = int(victim.rsplit(":", 1)[1])
        stack.enter_context(run_standin(str(tokenizer_dir), apps[2], port=port))
        deadline = time.monotonic() + 10
        while httpx.get(f"{proxy.url}/ready").json()["upstreams"][2]["state"] != "up":
            assert time.monotonic() < deadline, "the restarted upstream was not probed back in"
            time.sleep(0.05)
        for s in moved:
            _chat(proxy.url, s)
        assert [c.request["harnessrl_upstream"] for c in _calls(db)[-len(moved):]] == [victim] * len(moved)


@pytest.fixture
def three(tokenizer_dir):
    """Three stand-in apps and their URLs."""
    apps = [create_app(str(tokenizer_dir)) for _ in range(3)]
    with ExitStack() as stack:
        yield apps, [stack.enter_context(run_standin(str(tokenizer_dir), app)) for app in apps]


def _stream(proxy_url: str, session: str, retries: int = 0) -> str:
    """A slow streamed call (50 ms a token); its text."""
    chunks = _chat(proxy_url, session, retries, model="slow-stream", stream=True)
    return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def _push(proxy_url: str, version: str) -> dict:
    r = httpx.post(f"{proxy_url}/harnessrl/weights", json={"path": f"/ckpt/{version}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("mode", ["rolling", "all"])
def test_push_with_drain_loses_no_call_and_no_call_or_session_mixes_versions(three, tmp_path, mode):
    import threading

    apps, urls = three
    db = str(tmp_path / "runs.db")
    cfg = ProxyConfig(db=db, upstreams=tuple(urls), port=0, push_mode=mode, push_wait_s=30)
    sessions = [f"s{i}" for i in range(6)]
    pushed = threading.Event()
    errors: list[BaseException] = []
    with run_proxy(cfg) as proxy:
        def harness(session: str) -> None:
            try:
                n = 0
                while n < 2 or not pushed.is_set():  # calls before, during and after the push
                    _stream(proxy.url, session)
                    n += 1
                _stream(proxy.url, session)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=harness, args=(s,)) for s in sessions]
        for t in threads:
            t.start()
        while len([c for c in _calls(db) if c.status == "ok"]) < len(sessions):
            time.sleep(0.02)  # every session is under way
        report = _push(proxy.url, "v2")
        pushed.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert report["version"] == "v2" and all(u["drained"] and u["version"] == "v2" for u in report["upstreams"])
    assert [app.state.standin.reloads for app in apps] == [1, 1, 1]
    rows = _calls(db)
    assert all(c.status == "ok" for c in rows)  # no call lost or failed
    assert all("," not in c.weight_version for c in rows)  # no call spans two versions
    for s in sessions:
        versions = [c.weight_version for c in rows if c.session_id == s]
        assert versions[-1] == "v2" and "standin-v1" in versions
        # a session goes from the old version to the new one once, never back
        assert versions == sorted(versions, key=lambda v: v == "v2")


def test_push_without_drain_time_mixes_a_call_and_a_short_wait_answers_503(three, tmp_path):
    """The control: with no time to drain, a stream in flight spans two versions (what the
    checks above would catch); with --push-wait 0 a call for a draining upstream gets a
    retryable 503 with Retry-After, which the openai SDK retries until the push is done."""
    import threading

    apps, urls = three
    db = str(tmp_path / "runs.db")
    session = next(f"s{i}" for i in range(100) if ring_order(urls, ("roll", "agent", f"s{i}"))[0] == urls[0])
    with run_proxy(ProxyConfig(db=db, upstreams=tuple(urls), port=0, drain_timeout_s=0)) as proxy:
        chunks = _chat(proxy.url, session, model="slow-stream", stream=True)
        next(iter(chunks))  # the stream is under way on urls[0]
        assert not _push(proxy.url, "v2")["upstreams"][0]["drained"]
        "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    (mixed,) = _calls(db)
    assert mixed.weight_version == "standin-v1,v2"

    # a push that drains: the call arriving meanwhile is answered 503 + Retry-After at once
    with run_proxy(ProxyConfig(db=db, upstreams=tuple(urls), port=0, push_wait_s=0)) as proxy:
        chunks = _chat(proxy.url, session, model="slow-stream", stream=True)
        next(iter(chunks))
        push = threading.Thread(target=_push, args=(proxy.url, "v3"))
        push.start()
        while httpx.get(f"{proxy.url}/ready").json()["upstreams"][0]["state"] != "draining":
            time.sleep(0.01)
        with pytest.raises(openai.APIStatusError) as refused:
            _chat(proxy.url, session)
        assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"] == "1"
        assert refused.value.code == "upstream_reloading"
        late = threading.Thread(target=_chat, args=(proxy.url, session, 5))  # the SDK retries the 503
        late.start()
        "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        push.join(30)
        late.join(30)
    rows = _calls(db)
    # the 503s answered while it drained are refused calls, recorded (their number is the SDK's retries)
    refused_rows = [c for c in rows if c.status == "error"]
    assert refused_rows and all(c.error.startswith("503 server_error: upstream ") for c in refused_rows)
    assert [c.weight_version for c in rows if c.status == "ok"] == ["standin-v1,v2", "v2", "v3"]
