"""Committing on the event loop's thread (SQLite files): what it guarantees.

- Calls committed concurrently on a SQLite file are written by the event loop itself, in
  batches, with nothing left to the writer thread, and each `commit` returns only once its row
  is in the database; calls from a second event loop go to the writer thread.
- The loop never waits for the database: while another connection holds the write lock, the
  batch goes to the writer thread (which waits for the lock), and the loop keeps running.
- The loop's connection never checkpoints the WAL (a checkpoint fsyncs); the writer thread does,
  and gets the WAL restarted however busy the loop is: it stays bounded under sustained load;
  a WAL that grew behind a reader of an old snapshot is cut back once it restarts.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time

import pytest
from sqlalchemy import func, select

from harnessrl.db import open_db
from harnessrl.proxy.record.call_rows import new_call_id
from harnessrl.proxy.record.inline_commit import CHECKPOINT_CALLS, MAX_SKIP
from harnessrl.proxy.record.recorder import CallRecord, Recorder
from harnessrl.records import UNASSIGNED_ROLLOUT, Call

pytestmark = pytest.mark.unit


def _rec(text: str = "") -> CallRecord:
    return CallRecord(id=new_call_id(), rollout_id=UNASSIGNED_ROLLOUT, endpoint="chat",
                      request={"messages": [{"role": "user", "content": text}]}, created_at=time.time())


@pytest.fixture
def db(tmp_path):
    """(SQLite file, a recorder on it, a session factory to read it)."""
    path = tmp_path / "runs.db"
    engine, Session = open_db(str(path))
    recorder = Recorder(engine)
    yield path, recorder, Session
    recorder.close()
    engine.dispose()


def _count(Session) -> int:
    with Session() as s:
        return int(s.scalar(select(func.count()).select_from(Call)))


def test_concurrent_calls_are_committed_by_the_event_loop(db):
    _, recorder, Session = db
    seen_after_commit = []

    async def one() -> None:
        rec = _rec()
        await recorder.commit(rec)
        with Session() as s:  # another connection sees the row once commit() returns
            seen_after_commit.append(s.get(Call, rec.id) is not None)

    async def main() -> None:
        await asyncio.gather(*(one() for _ in range(200)))

    asyncio.run(main())
    assert recorder.committed == {"inline": 200, "writer": 0}
    assert all(seen_after_commit) and len(seen_after_commit) == 200
    assert _count(Session) == 200
    # another event loop's calls go to the writer thread (the inline batch belongs to one loop)
    asyncio.run(main())
    assert recorder.committed == {"inline": 200, "writer": 200}
    assert all(seen_after_commit) and _count(Session) == 400


def test_a_write_lock_held_elsewhere_goes_to_the_writer_thread_and_the_loop_keeps_running(db):
    path, recorder, Session = db
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # holds the write lock, as another process's writer would
    ticks = 0

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    async def main() -> tuple[int, int]:
        stop = asyncio.Event()
        t = asyncio.create_task(ticker(stop))
        threading.Timer(0.5, other.execute, ("COMMIT",)).start()  # the lock is released later
        commits = asyncio.gather(*(recorder.commit(_rec()) for _ in range(5)))
        await asyncio.sleep(0.3)
        ticks_while_locked = ticks
        await commits
        stop.set()
        await t
        return ticks_while_locked, _count(Session)

    try:
        ticks_while_locked, rows = asyncio.run(main())
        # the loop went on ticking while the lock was held (a blocked loop would not tick at all)
        assert ticks_while_locked >= 5
        assert rows == 5
        assert recorder.committed == {"inline": 0, "writer": 5}
    finally:
        other.close()


def test_the_writer_thread_checkpoints_the_wal(db):
    path, recorder, Session = db
    n = 4 * CHECKPOINT_CALLS

    async def main() -> None:
        for _ in range(n // 50):  # batches, as concurrent calls arrive
            await asyncio.gather(*(recorder.commit(_rec("x" * 4000)) for _ in range(50)))

    asyncio.run(main())
    # the batches that met the writer thread's RESTART checkpoint were committed by that thread
    assert sum(recorder.committed.values()) == n and recorder.committed["inline"] >= n // 2
    # SQLite writes the database file only when it checkpoints the WAL: the rows (4 KB of text
    # each) get there, although no connection has closed (the writer thread may still be running
    # the last checkpoint asked for: it gets 10 s)
    deadline = time.monotonic() + 10
    while os.path.getsize(path) <= n * 4000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.getsize(path) > n * 4000
    assert _count(Session) == n


def test_the_wal_stays_bounded_under_sustained_load(db):
    """Calls committed back to back leave no gap for a PASSIVE checkpoint to finish in, so the
    WAL never restarts and grows with every call (it reached 430 MB in 20 s of the proxy bench).
    The writer thread's checkpoint must get the WAL restarted however busy the loop is: its
    header's checkpoint sequence number (bytes 12-15) counts the restarts."""
    path, recorder, Session = db
    wal = path.with_name(path.name + "-wal")
    biggest, restarts, n = 0, set(), 0

    async def main() -> None:
        # 20 checkpoints' worth of calls at least. On a starved machine (CI's other jobs) the writer
        # thread may get its turns late and the WAL grow meanwhile, so calls go on (up to 5× as
        # many) until both bounds hold: a WAL that is restarted stays below a size while the rows
        # grow past it; the defect (no restart ever, a WAL as big as every row) fails at the end
        nonlocal biggest, n

        def bounded() -> bool:
            return len(restarts) >= 6 and biggest < n * 4000 / 2

        while n < 20 * CHECKPOINT_CALLS or (not bounded() and n < 100 * CHECKPOINT_CALLS):
            await asyncio.gather(*(recorder.commit(_rec("x" * 4000)) for _ in range(50)))
            n += 50
            with open(wal, "rb") as f:
                restarts.add(int.from_bytes(f.read(16)[12:16], "big"))
            biggest = max(biggest, wal.stat().st_size)

    asyncio.run(main())
    assert _count(Session) == n
    written = n * 4000  # what the rows alone hold; the WAL holds index pages besides
    assert len(restarts) >= 5, f"the WAL restarted {len(restarts) - 1} times in {n} calls"
    assert biggest < written / 2, f"WAL reached {biggest:,} bytes for {written:,} bytes of rows"


async def _until_restart(recorder: Recorder, text: str) -> None:
    """Commit calls, `CHECKPOINT_CALLS` at a time, until the writer thread's RESTART checkpoint
    succeeds; a backoff left by an old reader delays it by at most `MAX_SKIP` checkpoints (the
    writer thread may also fold several checkpoints asked meanwhile into one)."""
    cp = recorder.checkpoints
    start = cp.restarts
    for _ in range(4 * MAX_SKIP + 8):
        for _ in range(CHECKPOINT_CALLS // 50):
            await asyncio.gather(*(recorder.commit(_rec(text)) for _ in range(50)))
        await asyncio.to_thread(time.sleep, 0.05)  # the writer thread runs the checkpoint asked
        if cp.restarts > start:
            return
    raise AssertionError(f"no RESTART succeeded in {4 * MAX_SKIP + 8} checkpoints")


def test_a_reader_of_an_old_snapshot_does_not_hold_off_writers_at_every_checkpoint(db):
    """While another process reads an old snapshot (a long `harnessrl compile`), no checkpoint
    can restart the WAL, and each RESTART that tries holds off writers while it waits for that
    reader: the writer thread tries it ever more rarely, and again once the reader is gone."""
    path, recorder, Session = db
    rounds = 40
    cp = recorder.checkpoints
    seen = {}

    async def load() -> None:
        for _ in range(rounds * CHECKPOINT_CALLS // 50):
            await asyncio.gather(*(recorder.commit(_rec("x" * 1000)) for _ in range(50)))

    async def main() -> None:  # one loop: its calls are committed inline
        await load()
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM calls").fetchone()[0] == rounds * CHECKPOINT_CALLS
        await asyncio.to_thread(time.sleep, 0.5)  # the writer thread ends the checkpoints asked so far
        seen["before"] = (cp.tried, cp.restarts)
        await load()
        await asyncio.to_thread(time.sleep, 0.5)
        seen["held"] = (cp.tried, cp.restarts)
        reader.execute("COMMIT")
        reader.close()
        await _until_restart(recorder, "x" * 1000)  # fails if no RESTART is tried again

    asyncio.run(main())
    (t0, r0), (t1, r1) = seen["before"], seen["held"]
    assert r0 >= 1 and recorder.committed["inline"] > 0
    assert r1 == r0  # the reader's snapshot keeps the WAL from restarting
    assert 1 <= t1 - t0 <= rounds // 4, f"RESTART tried {t1 - t0} times in about {rounds} checkpoints"


def test_a_wal_grown_behind_an_old_reader_is_cut_back_once_it_restarts(tmp_path, monkeypatch):
    """RESTART reuses the WAL file but never shrinks it: what it grew to while a reader held an
    old snapshot would stay on disk for good. `journal_size_limit` cuts it back at the restart."""
    import harnessrl.db

    monkeypatch.setattr(harnessrl.db, "WAL_LIMIT_BYTES", 1 << 20)
    path = tmp_path / "runs.db"
    engine, _ = open_db(str(path))
    recorder = Recorder(engine)
    wal = path.with_name(path.name + "-wal")
    held: list[int] = []
    after: list[int] = []

    async def main() -> None:
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM calls").fetchone()
        for _ in range(8 * CHECKPOINT_CALLS // 50):
            await asyncio.gather(*(recorder.commit(_rec("x" * 2000)) for _ in range(50)))
            held.append(wal.stat().st_size)
        reader.execute("COMMIT")
        reader.close()
        await _until_restart(recorder, "x" * 2000)
        for _ in range(4):  # the first commit after the restart cuts the WAL back
            await asyncio.gather(*(recorder.commit(_rec("x" * 2000)) for _ in range(50)))
            after.append(wal.stat().st_size)

    try:
        asyncio.run(main())
    finally:
        recorder.close()
        engine.dispose()
    peak = max(held)
    assert peak > 8 * CHECKPOINT_CALLS * 2000  # every page stayed in the WAL behind the reader
    assert min(after) < peak / 2, f"the WAL stayed at {min(after):,} of {peak:,} bytes"
