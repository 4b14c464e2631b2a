"""Failed calls are never dropped while the records DB is away: they go to a local journal
(fsynced before the harness gets its 503) and are written once the DB is back, also after the
proxy was SIGKILLed, and never twice. Reproductions of issue 30 (2): more failed calls than the
old in-memory backlog held, a rollout row locked longer than twice the lock timeout, and a kill
with failed calls still waiting."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.record.recorder import CallRecord, DatabaseUnavailable, Recorder, RolloutBusy
from harnessrl.records import UNASSIGNED_ROLLOUT, Call, Rollout
from test_proxy_db_loss import Forwarder

ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=test"


def _rec(i: int | str, rollout: str = UNASSIGNED_ROLLOUT) -> CallRecord:
    return CallRecord(id=f"c{i}", rollout_id=rollout, endpoint="chat", request={"messages": [], "n": i},
                      created_at=time.time(), prompt_ids=b"\x01\x00\x00\x00", response_text="a\x00b")


def _stored(db: str) -> dict[str, tuple[str, str | None]]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = {cid: (status, err) for cid, status, err in s.execute(select(Call.id, Call.status, Call.error))}
    engine.dispose()
    return rows


def _through(fwd: Forwarder, pg_url: str) -> str:
    u = urlsplit(pg_url)
    return urlunsplit(u._replace(netloc=f"{u.username}@127.0.0.1:{fwd.port}"))


def _wait_for(pred, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


async def _commit_expecting(recorder: Recorder, rec: CallRecord, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        await recorder.commit(rec)


def test_more_failed_calls_than_the_journal_row_cap_are_all_written(pg_url, tmp_path):
    """Many more calls fail while the DB is away than one journal chunk holds; every one is
    written as a failed call once the DB is back (the old backlog kept the last 10,000 only:
    here its cap was 50 and 70 of the 120 were lost)."""
    fwd = Forwarder((urlsplit(pg_url).hostname, urlsplit(pg_url).port))
    engine, _ = open_db(_through(fwd, pg_url))
    recorder = Recorder(engine, retry_s=0.2, max_batch=16, spill_dir=tmp_path / "spill")
    try:
        asyncio.run(recorder.commit(_rec(0)))
        fwd.down()

        async def away() -> None:
            await asyncio.gather(*(_commit_expecting(recorder, _rec(i), DatabaseUnavailable) for i in range(1, 121)))

        asyncio.run(away())
        assert recorder.health()["backlog"] == 120
        fwd.up()
        _wait_for(lambda: recorder.health()["backlog"] == 0)
        asyncio.run(recorder.commit(_rec(121)))
    finally:
        recorder.close()
        engine.dispose()
        fwd.down()
    stored = _stored(pg_url)
    assert len(stored) == 122
    assert {k: v[0] for k, v in stored.items()} == {"c0": "ok", "c121": "ok",
                                                    **{f"c{i}": "error" for i in range(1, 121)}}
    assert stored["c7"][1].startswith("503 server_error: the records database is unavailable")
    assert list((tmp_path / "spill").glob("*")) == []  # a drained journal leaves nothing behind


def test_a_rollout_row_locked_past_twice_the_lock_timeout_loses_no_call(pg_url, tmp_path):
    """busy_s 0.3: a call waits 0.3 s on the locked row, is answered 503, and (before the fix)
    was dropped 0.3 s later; the lock is held 1.5 s. Now it is written once the lock is gone."""
    engine, Session = open_db(pg_url, lock_timeout_s=0.3)
    recorder = Recorder(engine, busy_s=0.3, spill_dir=tmp_path / "spill")
    try:
        asyncio.run(recorder.commit(_rec(0)))  # creates the unassigned rollout row
        schema = pg_url.split("search_path%3D", 1)[1]
        release = threading.Event()
        locked = threading.Event()

        def hold() -> None:
            with psycopg.connect(ADMIN) as c:
                c.execute(f"SELECT id FROM {schema}.rollouts WHERE id = %s FOR UPDATE", (UNASSIGNED_ROLLOUT,))
                locked.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        locked.wait(5)
        t0 = time.monotonic()

        async def busy() -> None:
            await asyncio.gather(*(_commit_expecting(recorder, _rec(i), RolloutBusy) for i in (1, 2, 3)))

        asyncio.run(busy())
        assert time.monotonic() - t0 < 1.0
        time.sleep(1.5 - (time.monotonic() - t0))  # > 2 x busy_s: the old code had dropped them
        release.set()
        holder.join()
        _wait_for(lambda: {"c1", "c2", "c3"} <= set(_stored(pg_url)))
    finally:
        recorder.close()
        engine.dispose()
    stored = _stored(pg_url)
    assert {k: v[0] for k, v in stored.items()} == {"c0": "ok", "c1": "error", "c2": "error", "c3": "error"}
    assert stored["c2"][1].startswith("503 server_error: the rollout's database row is locked")
    with Session() as s:  # each counts once as its rollout's error
        assert s.get(Rollout, UNASSIGNED_ROLLOUT).errors == 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_proxy(upstream: str, db: str, spill_dir, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", "from harnessrl.app.cli import main; main()", "proxy",
                             "--upstream", upstream, "--db", db, "--port", str(port),
                             "--spill-dir", str(spill_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"the proxy exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.1)


def test_sigkill_with_failed_calls_in_the_journal_writes_them_at_the_next_start(upstream, pg_url, tmp_path):
    fwd = Forwarder((urlsplit(pg_url).hostname, urlsplit(pg_url).port))
    db = _through(fwd, pg_url)
    port = _free_port()
    spill = tmp_path / "spill"
    proc = _start_proxy(upstream, db, spill, port)
    failed: list[str] = []
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        assert httpx.post(url, json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
        fwd.down()
        for j in range(40):
            body = {"model": "m", "messages": [{"role": "user", "content": f"away {j}"}], "stream": j % 2 == 0}
            r = httpx.post(url, json=body, timeout=30)
            assert r.status_code == 503 or (body["stream"] and "database_unavailable" in r.text), r.text
            failed.append(r.headers["x-harnessrl-call"])
        assert sum(p.stat().st_size for p in spill.rglob("*.jsonl")) > 0
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    fwd.up()
    assert set(failed).isdisjoint(_stored(pg_url))  # nothing written yet: all of it is in the journal
    left = {p.relative_to(spill): p.read_bytes() for p in spill.rglob("*") if p.is_file()}
    for again in (False, True):
        if again:  # the same journal once more (a replay cut short by a second kill): nothing written twice
            for rel, data in left.items():
                (spill / rel).parent.mkdir(parents=True, exist_ok=True)
                (spill / rel).write_bytes(data)
        proc = _start_proxy(upstream, db, spill, port)
        try:
            _wait_for(lambda: set(failed) <= set(_stored(pg_url)))
            _wait_for(lambda: not any(p.stat().st_size for p in spill.rglob("*.jsonl")))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    fwd.down()
    stored = _stored(pg_url)
    assert len(stored) == 41
    assert all(stored[c][0] == "error" and "records database is unavailable" in stored[c][1] for c in failed)
    assert list(spill.rglob("*")) == []
    engine, Session = open_db(pg_url)
    with Session() as s:  # each failed call counts once as its rollout's error
        assert s.get(Rollout, UNASSIGNED_ROLLOUT).errors == 40
    engine.dispose()


def test_a_full_journal_turns_new_calls_away_and_drops_none(upstream, pg_url, tmp_path):
    """Journal bound 2 KiB (a failed call's row is ~0.5 KiB): once it is full, new model calls are
    refused with the DB's own 503 before they reach the model, and counted; every call that did
    reach the model is written once the DB is back; then calls are taken again."""
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    fwd = Forwarder((urlsplit(pg_url).hostname, urlsplit(pg_url).port))
    cfg = ProxyConfig(db=_through(fwd, pg_url), upstream=upstream, port=0, spill_dir=str(tmp_path),
                      spill_max_bytes=2048)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with run_proxy(cfg) as proxy:
        url = proxy.url + "/v1/chat/completions"
        assert httpx.post(url, json=body).status_code == 200
        fwd.down()
        answers = [httpx.post(url, json=body, timeout=30) for _ in range(30)]
        assert {r.status_code for r in answers} == {503}
        assert all(r.json()["error"]["code"] == "database_unavailable" and r.headers["retry-after"] == "1"
                   for r in answers)
        metrics = httpx.get(proxy.url + "/metrics").text
        refused = float(metrics.split("\nharnessrl_spill_refused_calls_total ", 1)[1].split()[0])
        assert 0 < refused < 30
        assert "\nharnessrl_spill_dropped_calls_total 0.0" in metrics
        journaled = float(metrics.split("\nharnessrl_spill_rows ", 1)[1].split()[0])
        assert journaled == 30 - refused
        fwd.up()
        deadline = time.monotonic() + 20
        while (r := httpx.post(url, json=body, timeout=30)).status_code != 200:
            assert time.monotonic() < deadline, "calls are still refused after the DB came back"
            time.sleep(0.2)
        _wait_for(lambda: "\nharnessrl_spill_rows 0.0" in httpx.get(proxy.url + "/metrics").text)
    fwd.down()
    stored = _stored(pg_url)
    ids = [a.headers["x-harnessrl-call"] for a in answers]
    assert sum(i in stored for i in ids) == journaled  # each call that reached the model, none refused
    assert all(stored[i][0] == "error" for i in ids if i in stored)


def test_journal_location_is_keyed_by_the_db_without_its_password(tmp_path, monkeypatch):
    from harnessrl.proxy.record.failed_call_journal import default_dir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_dir(f"sqlite:///{tmp_path}/runs.db") == tmp_path / "runs.db-spill"
    a = default_dir("postgresql+psycopg://u:secret@db:5432/prod?options=-csearch_path%3Dx")
    assert a.parent == tmp_path / "state" / "harnessrl" / "spill" and a.name.startswith("postgresql-prod-")
    assert default_dir("postgresql+psycopg://u:other@db:5432/prod?options=-csearch_path%3Dx") == a
    assert default_dir("postgresql+psycopg://u@db:5432/prod?options=-csearch_path%3Dy") != a
    assert "secret" not in str(a)
    assert default_dir("postgresql+psycopg://u@db/prod", tmp_path / "given").parent == tmp_path / "given"


def test_a_journal_left_by_a_dead_proxy_is_adopted_without_its_cut_last_line(tmp_path):
    """A proxy killed mid-append leaves a partial last line (its batch was never answered): the
    next proxy takes the whole lines over and skips the cut one; a live proxy's journal is left alone."""
    import fcntl

    from harnessrl.proxy.record.failed_call_journal import Spill

    dead = Spill(tmp_path)
    dead.append([_rec(1), _rec(2)])
    path = next(tmp_path.glob("*.jsonl"))
    with open(path, "ab") as f:
        f.write(b'{"id": "c3", "rollout_id": "unas')  # cut by the kill
    live = Spill(tmp_path)  # started while the other still ran: nothing to adopt
    live.append([_rec(4)])
    os.close(dead._lock_fd)  # the process is gone: its lock with it
    fd = os.open(tmp_path / f"{live._name}.lock", os.O_RDWR)
    with pytest.raises(BlockingIOError):  # held by its (live) owner
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
    adopter = Spill(tmp_path)
    assert adopter.rows == 2 and not path.exists()
    got = adopter.take(10)
    assert [(r.id, r.prompt_ids, r.response_text, r.request) for r in got] == [
        ("c1", b"\x01\x00\x00\x00", "a\x00b", {"messages": [], "n": 1}),
        ("c2", b"\x01\x00\x00\x00", "a\x00b", {"messages": [], "n": 2})]
    adopter.settle(2, [])
    assert adopter.rows == 0 and adopter.bytes == 0
    assert live.rows == 1 and (tmp_path / f"{live._name}.jsonl").exists()


def test_the_journal_bound_must_be_positive():
    from harnessrl.errors import UserError
    from harnessrl.proxy.config import ProxyConfig

    with pytest.raises(UserError, match="--spill-max-mb must be positive"):
        ProxyConfig(upstream="http://127.0.0.1:1", spill_max_bytes=0).check()
