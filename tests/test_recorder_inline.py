"""Committing on the event loop's thread (SQLite files): what it guarantees.

- Calls committed concurrently on a SQLite file are written by the event loop itself, in
  batches, with nothing left to the writer thread, and each `commit` returns only once its row
  is in the database; calls from a second event loop go to the writer thread.
- The loop never waits for the database: while another connection holds the write lock, the
  batch goes to the writer thread (which waits for the lock), and the loop keeps running.
- The loop's connection never checkpoints the WAL (a checkpoint fsyncs); the writer thread does.
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
from harnessrl.proxy.callrows import new_call_id
from harnessrl.proxy.inline_commit import CHECKPOINT_CALLS
from harnessrl.proxy.recorder import CallRecord, Recorder
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
    assert recorder.committed["inline"] == n
    # SQLite writes the database file only when it checkpoints the WAL: the rows (4 KB of text
    # each) get there, although no connection has closed (the writer thread may still be running
    # the last checkpoint asked for: it gets 10 s)
    deadline = time.monotonic() + 10
    while os.path.getsize(path) <= n * 4000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.getsize(path) > n * 4000
    assert _count(Session) == n
