"""A long records-DB outage under load: PostgreSQL unreachable for `outage_s` seconds while
clients keep calling, then back. Every call answered 503 meanwhile must end up in the DB as a
failed call (the failed-call journal, `proxy/record/failed_call_journal.py`); every acknowledged call as ok.

    python bench/fault_db_outage.py [--outage 15] [--clients 24] [--pg postgresql+psycopg://postgres@127.0.0.1:5432/test]

The outage is a TCP relay between the proxy and PostgreSQL that cuts every connection and
refuses new ones (a server stop or failover as the proxy sees it), so the shared server keeps
running for everyone else. Then the row lock: the rollout row the calls record into held by
another session past twice the lock timeout. `db_outage(...)` and `row_locked(...)` each return
one result row for `bench/faults.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import free_port, proxy_cmd, standin_cmd, stop, wait_ready  # noqa: E402

HANG_S = 30.0


class Relay:
    """TCP relay to `target` that can be taken down (connections cut, new ones refused) and up."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.port, self._open, self._lock = target, 0, [], threading.Lock()
        self.up()

    def up(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port), backlog=128)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def down(self) -> None:
        for s in [self._listener, *self._open]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self._lock:
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
                server = socket.create_connection(self.target)
            except OSError:
                return
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


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
    return float(line.split()[1])


async def _load(url: str, clients: int, until, calls: list) -> None:
    """Each client calls in a loop until `until()`; `calls` gets (call id, outcome) per call."""
    async def worker(k: int, client: httpx.AsyncClient) -> None:
        j = 0
        while not until():
            j += 1
            stream = j % 3 == 0
            body = {"model": "m", "messages": [{"role": "user", "content": f"w{k} {j}"}], "max_tokens": 8,
                    "stream": stream}
            try:
                r = await client.post(url + "/v1/chat/completions", json=body)
            except httpx.TimeoutException:
                calls.append((None, "hang"))
                continue
            done = r.status_code == 200 and (not stream or r.text.endswith("data: [DONE]\n\n"))
            # a stream whose last chunk could not be recorded ends with an error event after its 200
            outcome = "ok" if done else "stream-error" if r.status_code == 200 else str(r.status_code)
            calls.append((r.headers.get("x-harnessrl-call"), outcome))

    async with httpx.AsyncClient(timeout=HANG_S, limits=httpx.Limits(max_connections=clients)) as client:
        await asyncio.gather(*(worker(k, client) for k in range(clients)))


def db_outage(upstream: str, pg_db: str, spill_dir: Path, outage_s: float = 15.0, clients: int = 24,
              spill_max_mb: float | None = None) -> dict:
    """Load the proxy (on `pg_db`, a fresh schema) with `clients` clients for 2 s, take PostgreSQL
    away for `outage_s`, bring it back for 3 s of load, then wait (up to 120 s) for the journal to
    drain. Returns calls made / acknowledged / failed / written (failed calls in the DB) / lost
    (acknowledged but not in the DB) / dropped (failed calls that reached the model and are not in
    the DB) / refused (turned away at a full journal) / 5xx (other than the DB's 503) / hangs, and
    the seconds the journal took to drain."""
    u = urlsplit(pg_db)
    relay = Relay((u.hostname or "127.0.0.1", u.port or 5432))
    db = urlunsplit(u._replace(netloc=f"{u.username}@127.0.0.1:{relay.port}"))
    port = free_port()
    extra = ["--spill-max-mb", str(spill_max_mb)] if spill_max_mb is not None else []
    proc = subprocess.Popen(proxy_cmd("--upstream", upstream, "--db", db, "--port", str(port), "--no-ui",
                                      "--spill-dir", str(spill_dir), *extra),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    calls: list = []
    try:
        wait_ready(url, proc)
        t0 = time.monotonic()
        phase = {"down": t0 + 2.0, "up": t0 + 2.0 + outage_s, "end": t0 + 5.0 + outage_s}

        async def run() -> None:
            async def outage() -> None:
                await asyncio.sleep(phase["down"] - time.monotonic())
                relay.down()
                await asyncio.sleep(phase["up"] - time.monotonic())
                relay.up()

            await asyncio.gather(outage(), _load(url, clients, lambda: time.monotonic() > phase["end"], calls))

        asyncio.run(run())
        drain_s = _drain(url)
        refused = _metric(url, "harnessrl_spill_refused_calls_total")
        spill_dropped = _metric(url, "harnessrl_spill_dropped_calls_total")
    finally:
        stop(proc)
        relay.down()
    return {**_counts(pg_db, calls, refused, drain_s), "journal_write_errors": int(spill_dropped)}


def _drain(url: str) -> float:
    """Seconds until the proxy's failed-call journal is written back (at most 120)."""
    t0 = time.monotonic()
    while _metric(url, "harnessrl_spill_rows") > 0 and time.monotonic() - t0 < 120:
        time.sleep(0.2)
    return time.monotonic() - t0


def _counts(pg_db: str, calls: list, refused: float, drain_s: float) -> dict:
    """What became of each call (its answer vs its row in the DB)."""
    from sqlalchemy import select

    from harnessrl.db import open_db
    from harnessrl.records import Call

    engine, Session = open_db(pg_db)
    with Session() as s:
        stored = dict(s.execute(select(Call.id, Call.status)).all())
    engine.dispose()
    acked = [c for c, o in calls if o == "ok"]
    failed = [c for c, o in calls if o not in ("ok", "hang")]
    return {"made": len(calls), "acknowledged": len(acked), "failed": len(failed),
            "written": sum(stored.get(c) == "error" for c in failed), "lost": sum(c not in stored for c in acked),
            "dropped": sum(c not in stored for c in failed) - int(refused), "refused": int(refused),
            "5xx": sum(o.startswith("5") and o != "503" for _, o in calls),
            "hangs": sum(o == "hang" for _, o in calls), "drain_s": round(drain_s, 1)}

def row_locked(upstream: str, pg_db: str, spill_dir: Path, hold_s: float = 5.0, lock_timeout_s: float = 1.0,
               clients: int = 8) -> dict:
    """The rollout row every call of this load records into (the unassigned rollout) held locked
    by another session for `hold_s` (past twice `--db-lock-timeout`) while `clients` call; the
    same counts as `db_outage` once the lock is gone and the journal drained."""
    import psycopg

    from harnessrl.records import UNASSIGNED_ROLLOUT

    port = free_port()
    proc = subprocess.Popen(proxy_cmd("--upstream", upstream, "--db", pg_db, "--port", str(port), "--no-ui",
                                      "--spill-dir", str(spill_dir), "--db-lock-timeout", str(lock_timeout_s)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    calls: list = []
    schema = pg_db.split("search_path%3D", 1)[1]
    try:
        wait_ready(url, proc)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        httpx.post(url + "/v1/chat/completions", json=body, timeout=HANG_S)  # the rollout row exists
        with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test") as c:
            c.execute(f"SELECT id FROM {schema}.rollouts WHERE id = %s FOR UPDATE", (UNASSIGNED_ROLLOUT,))
            t_end = time.monotonic() + hold_s
            asyncio.run(_load(url, clients, lambda: time.monotonic() > t_end, calls))
        drain_s = _drain(url)
        refused = _metric(url, "harnessrl_spill_refused_calls_total")
    finally:
        stop(proc)
    return _counts(pg_db, calls, refused, drain_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--outage", type=float, default=15.0, help="seconds PostgreSQL is away")
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--spill-max-mb", type=float, default=None, help="the proxy's journal bound (default its own)")
    args = ap.parse_args()
    import psycopg

    from harnessrl.tiny_model import build_tokenizer

    tmp = Path(tempfile.mkdtemp(prefix="harnessrl-outage-"))
    build_tokenizer().save_pretrained(tmp / "tok")
    schema = f"outage_{uuid.uuid4().hex[:8]}"
    admin = "host=127.0.0.1 port=5432 user=postgres dbname=test"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    port = free_port()
    standin = subprocess.Popen(standin_cmd(tmp / "tok", port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}", standin, "/v1/models")
        up, db = f"http://127.0.0.1:{port}", f"{args.pg}?options=-csearch_path%3D{schema}"
        row = db_outage(up, db, tmp / "spill", args.outage, args.clients, args.spill_max_mb)
        locked = row_locked(up, db, tmp / "spill")
    finally:
        standin.kill()
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f"DROP SCHEMA {schema} CASCADE")
    print(f"PostgreSQL away {args.outage:g} s under {args.clients} clients:")
    print("  " + "  ".join(f"{k} {v}" for k, v in row.items()))
    print("its rollout row locked 5 s (--db-lock-timeout 1) under 8 clients:")
    print("  " + "  ".join(f"{k} {v}" for k, v in locked.items()))


if __name__ == "__main__":
    main()
