"""The proxy's PostgreSQL connection dies under load (terminated backend; a server that is away
for a while): no call hangs, a call that cannot be recorded gets an OpenAI-shaped 503, calls
succeed again once the DB is reachable, and every answered call is in the DB."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson
import psycopg
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call

CALL_BOUND_S = 10.0  # no call may take longer than this (the client's timeout)


def _stored(db: str) -> dict[str, str]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = {cid: status for cid, status in s.execute(select(Call.id, Call.status))}
    engine.dispose()
    return rows


class Outcomes:
    """Every call's id, status, error code and duration, in the order they finished."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str | None, float, float]] = []  # id, status, code, start, seconds

    def ok(self) -> list[str]:
        return [c[0] for c in self.calls if c[1] == 200]

    def failed(self) -> list[tuple[str, int, str | None, float, float]]:
        return [c for c in self.calls if c[1] != 200]


async def _call(client: httpx.AsyncClient, url: str, text: str, stream: bool, out: Outcomes) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 8, "stream": stream}
    t0 = time.monotonic()
    r = await client.post(url + "/v1/chat/completions", json=body)  # a hang raises ReadTimeout: test fails
    dt = time.monotonic() - t0
    call_id = r.headers["x-harnessrl-call"]
    if r.status_code == 200 and stream:
        if r.text.endswith("data: [DONE]\n\n"):
            out.calls.append((call_id, 200, None, t0, dt))
            return
        # a stream whose terminal chunk could not be recorded ends with an error event
        err = orjson.loads(r.text.rstrip().rsplit("data: ", 1)[1])["error"]
        out.calls.append((call_id, 503 if err["code"] == "database_unavailable" else 500, err["code"], t0, dt))
        return
    code = None
    if r.status_code != 200:
        err = r.json()["error"]  # OpenAI-shaped, with no database text in it
        assert err["type"] == "server_error" and err["code"] == "database_unavailable", err
        assert "psycopg" not in err["message"] and "SQL" not in err["message"], err
        assert r.headers["retry-after"] == "1"
        code = err["code"]
    out.calls.append((call_id, r.status_code, code, t0, dt))


def test_terminated_backends_mid_load_lose_nothing_and_hang_nothing(upstream, pg_url):
    app_name = f"hrl_{uuid.uuid4().hex[:10]}"
    db = f"{pg_url}&application_name={app_name}"
    out = Outcomes()
    kills: list[tuple[float, int]] = []
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        stop = asyncio.Event()

        async def worker(k: int, client: httpx.AsyncClient) -> None:
            j = 0
            while not stop.is_set():
                await _call(client, proxy.url, f"w{k} {j}", j % 3 == 0, out)
                j += 1

        async def killer() -> None:
            for _ in range(3):  # three kills, each mid-load
                n = len(out.calls)
                while len(out.calls) < n + 60:
                    await asyncio.sleep(0.01)
                with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True) as c:
                    got = c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE application_name = %s", (app_name,)).fetchall()
                kills.append((time.monotonic(), len(got)))
            await asyncio.sleep(1.5)  # load goes on after the last kill
            stop.set()

        async def main() -> None:
            async with httpx.AsyncClient(timeout=CALL_BOUND_S, limits=httpx.Limits(max_connections=16)) as client:
                await asyncio.gather(killer(), *(worker(k, client) for k in range(16)))

        asyncio.run(main())
    assert all(n >= 1 for _, n in kills)  # the proxy's writer connection was among those killed
    assert max(c[4] for c in out.calls) < CALL_BOUND_S
    assert {c[1] for c in out.calls} <= {200, 503}  # never a 500, never a hang
    after_last_kill = [c for c in out.calls if c[3] > kills[-1][0] + 0.5]
    assert after_last_kill and all(c[1] == 200 for c in after_last_kill)
    stored = _stored(pg_url)
    assert set(out.ok()) <= set(stored)  # nothing acknowledged is lost
    assert all(stored[c] == "ok" for c in out.ok())
    # a call answered 503 is recorded as failed once the DB is back
    assert all(stored.get(c[0]) == "error" for c in out.failed())
    print(f"\nterminate x3: {len(out.calls)} calls, {len(out.failed())} x 503, "
          f"max call {max(c[4] for c in out.calls):.2f} s")


class Forwarder:
    """A TCP relay in front of PostgreSQL that can be taken away (every connection cut and new
    ones refused) and brought back: a server restart or failover as the proxy sees it."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self.up()

    def up(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def down(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); stops listening
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def test_database_away_for_seconds_gives_fast_503_then_recovers(upstream, pg_url):
    u = urlsplit(pg_url)
    fwd = Forwarder((u.hostname, u.port))
    db = urlunsplit(u._replace(netloc=f"{u.username}@127.0.0.1:{fwd.port}"))
    out = Outcomes()
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        phase: dict[str, float] = {}

        async def worker(k: int, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
            j = 0
            while not stop.is_set():
                await _call(client, proxy.url, f"w{k} {j}", False, out)
                j += 1
                await asyncio.sleep(0.02)

        async def main() -> None:
            stop = asyncio.Event()
            async with httpx.AsyncClient(timeout=CALL_BOUND_S, limits=httpx.Limits(max_connections=8)) as client:
                workers = [asyncio.create_task(worker(k, client, stop)) for k in range(8)]
                await asyncio.sleep(1.0)
                phase["down"] = time.monotonic()
                fwd.down()
                await asyncio.sleep(4.0)
                phase["up"] = time.monotonic()
                fwd.up()
                await asyncio.sleep(3.0)
                stop.set()
                await asyncio.gather(*workers)

        asyncio.run(main())
    fwd.down()
    assert max(c[4] for c in out.calls) < CALL_BOUND_S
    assert {c[1] for c in out.calls} <= {200, 503}
    before = [c for c in out.calls if c[3] + c[4] < phase["down"]]
    during = [c for c in out.calls if phase["down"] + 2.5 < c[3] and c[3] + c[4] < phase["up"]]
    assert before and all(c[1] == 200 for c in before)
    # once the writer knows the DB is away, calls fail fast (no 2 s retry window each)
    assert during and all(c[1] == 503 for c in during)
    assert max(c[4] for c in during) < 0.5
    # back: calls succeed again within a few backoff steps (the backoff is capped at 1 s)
    first_ok = min(c[3] + c[4] for c in out.calls if c[1] == 200 and c[3] > phase["up"])
    assert first_ok - phase["up"] < 3.0
    last = [c for c in out.calls if c[3] > phase["up"] + 2.5]
    assert last and all(c[1] == 200 for c in last)
    stored = _stored(pg_url)
    assert set(out.ok()) <= set(stored) and all(stored[c] == "ok" for c in out.ok())
    # recorded as failed once back (also a call whose commit landed but whose answer was lost)
    assert {c[0]: stored.get(c[0]) for c in out.failed()} == {c[0]: "error" for c in out.failed()}
    fails = [c[4] for c in out.failed()]
    print(f"\noutage 4 s: {len(out.calls)} calls, {len(fails)} x 503 (max {max(fails):.2f} s, "
          f"median {sorted(fails)[len(fails) // 2]:.3f} s), first 200 {first_ok - phase['up']:.2f} s after the DB "
          f"came back")


def test_recorder_health_follows_the_connection(pg_url):
    """The writer's state as readiness will report it: ok → reconnecting (calls fail with
    DatabaseUnavailable, at once) → ok, and the failed call is written once the DB is back."""
    from harnessrl.proxy.record.recorder import CallRecord, DatabaseUnavailable, Recorder
    from harnessrl.records import UNASSIGNED_ROLLOUT

    u = urlsplit(pg_url)
    fwd = Forwarder((u.hostname, u.port))
    engine, _ = open_db(urlunsplit(u._replace(netloc=f"{u.username}@127.0.0.1:{fwd.port}")))
    recorder = Recorder(engine, retry_s=0.5)

    def rec(i: int) -> CallRecord:
        return CallRecord(id=f"c{i}", rollout_id=UNASSIGNED_ROLLOUT, endpoint="chat", request={},
                          created_at=time.time())

    async def commit(i: int) -> float:
        t0 = time.monotonic()
        await recorder.commit(rec(i))
        return time.monotonic() - t0

    try:
        asyncio.run(commit(1))
        assert recorder.health() == {"writer": "ok", "last_error": None, "queue": 0, "backlog": 0}
        fwd.down()
        t0 = time.monotonic()
        try:
            asyncio.run(commit(2))
            raise AssertionError("a commit with the DB away succeeded")
        except DatabaseUnavailable:
            pass
        assert time.monotonic() - t0 < 1.5  # the 0.5 s retry window, not a hang
        h = recorder.health()
        assert h["writer"] == "reconnecting" and h["last_error"] and h["backlog"] == 1
        fwd.up()
        deadline = time.monotonic() + 5
        i = 3
        while True:  # a retry (a new call) once the DB is back succeeds within the backoff
            try:
                asyncio.run(commit(i))
                break
            except DatabaseUnavailable:
                assert time.monotonic() < deadline
                time.sleep(0.1)
                i += 1
        while recorder.health()["backlog"]:  # the journaled failed calls are written between live batches
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert recorder.health()["writer"] == "ok"
    finally:
        recorder.close()
        engine.dispose()
        fwd.down()
    # every call is there: the ones answered DatabaseUnavailable as failed calls
    assert _stored(pg_url) == {"c1": "ok", **{f"c{k}": "error" for k in range(2, i)}, f"c{i}": "ok"}


def test_readiness_and_the_rollout_api_while_the_database_is_away(upstream, pg_url):
    """With the DB away: /health still 200, /ready 503 naming the failing checks, the rollout API
    and a call to a rollout the proxy has not seen a fast 503 `database_unavailable` with
    Retry-After and no database text; all back to normal once the DB returns."""
    u = urlsplit(pg_url)
    fwd = Forwarder((u.hostname, u.port))
    db = urlunsplit(u._replace(netloc=f"{u.username}@127.0.0.1:{fwd.port}"))
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        assert httpx.get(proxy.url + "/ready").json()["status"] == "ready"
        fwd.down()
        try:
            assert httpx.get(proxy.url + "/health").status_code == 200
            ready = httpx.get(proxy.url + "/ready", timeout=CALL_BOUND_S)
            assert ready.status_code == 503 and ready.json()["checks"]["database"] == "unreachable"
            for r in (httpx.post(proxy.url + "/harnessrl/rollouts", json={}, timeout=CALL_BOUND_S),
                      httpx.post(proxy.url + "/r/never-seen/a/x/v1/chat/completions", timeout=CALL_BOUND_S,
                                 json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})):
                assert r.status_code == 503 and r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == "database_unavailable"
                assert "psycopg" not in r.text.lower() and "sql" not in r.text.lower()
        finally:
            fwd.up()
        deadline = time.monotonic() + CALL_BOUND_S
        while httpx.get(proxy.url + "/ready", timeout=CALL_BOUND_S).status_code != 200:
            assert time.monotonic() < deadline, "not ready again after the DB came back"
            time.sleep(0.2)
        assert httpx.post(proxy.url + "/harnessrl/rollouts", json={}).status_code == 200
