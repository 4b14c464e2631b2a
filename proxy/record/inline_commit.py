"""SQLite group commit on the event loop's own thread.

On a SQLite file (WAL, synchronous=NORMAL: a commit is a write to the WAL, no fsync) the event
loop writes a batch faster than it can hand it to the recorder's writer thread: a hand-off costs
a thread wake-up, GIL switches while both threads run Python, and a cross-thread wake-up of the
loop to resolve each batch's futures. So the calls committed during one iteration of the event
loop are written here, in one transaction, once that iteration's callbacks have run.

The loop must never block on the database, so this connection waits for no lock
(busy_timeout=0) and never checkpoints the WAL (a checkpoint fsyncs). A batch that finds the
write lock taken (another process, the rollout API) or meets any error is rolled back and
handed, unchanged, to the writer thread, which has the waiting, retry, row-by-row and journal
logic; the writer thread also runs the WAL checkpoints (`Checkpointer`), when asked for one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from harnessrl.db import sqlite_file
from harnessrl.proxy.record.call_rows import RowWriter

log = logging.getLogger("harnessrl.proxy.recorder")

# calls committed inline after which the writer thread is asked for a WAL checkpoint: a call row
# with its request and response is a few 4 KiB pages, so about SQLite's own automatic threshold
# (1,000 pages)
CHECKPOINT_CALLS = 400
# how long the RESTART checkpoint may hold off writers waiting for the lock or for old readers
RESTART_WAIT_MS = 20
MAX_SKIP = 64  # checkpoints that skip RESTART after RESTARTs defeated by an old reader


def inline_capable(engine: Engine) -> bool:
    """A SQLite file (an in-memory DB shares one connection between threads: no second one)."""
    return sqlite_file(engine) is not None


class Checkpointer:
    """The WAL checkpoints the inline commits leave to the writer thread, run on its connection.

    PASSIVE copies the WAL into the database while the loop goes on committing; it waits for no
    one, but the loop appends frames meanwhile, so it never ends with the whole WAL copied, and
    the WAL, which restarts only after a checkpoint that copied all of it, would grow with every
    call while calls keep coming. RESTART then copies the few frames appended since, holding off
    writers while it runs (the loop's batches come to this thread meanwhile), so the next commit
    writes the WAL from its start. It waits at most `RESTART_WAIT_MS` for the write lock and for
    readers of older snapshots. Such a reader (another process's long read, `harnessrl compile`
    on a live DB) keeps the WAL from restarting anyway: each RESTART it defeats doubles the
    number of checkpoints that skip RESTART (up to `MAX_SKIP`), so it does not hold off writers
    at every checkpoint."""

    def __init__(self) -> None:
        self.restarts = 0  # RESTART checkpoints that completed
        self.tried = 0  # RESTART checkpoints attempted
        self._skip = 0
        self._backoff = 0

    def __call__(self, conn) -> None:
        try:
            cur = conn.cursor()
            cur.execute("PRAGMA wal_checkpoint(PASSIVE)")
            cur.fetchall()
            if self._skip:
                self._skip -= 1
            else:
                self._restart(cur)
            cur.close()
        except Exception as exc:  # noqa: BLE001 - the writer's next batch reports a lost DB
            log.debug("recorder: WAL checkpoint failed: %s", exc)

    def _restart(self, cur) -> None:
        cur.execute("PRAGMA busy_timeout")
        (wait,) = cur.fetchone()
        cur.execute(f"PRAGMA busy_timeout={RESTART_WAIT_MS}")
        try:
            self.tried += 1
            cur.execute("PRAGMA wal_checkpoint(RESTART)")
            (busy, _, _) = cur.fetchone()
        finally:
            cur.execute(f"PRAGMA busy_timeout={int(wait)}")
        if busy:
            self._backoff = min(max(1, 2 * self._backoff), MAX_SKIP)
            self._skip = self._backoff
        else:
            self._backoff = 0
            self.restarts += 1


def resolve(done: list[tuple[Any, Exception | None]]) -> None:
    """Answer each waiting call: (future, None) committed, (future, error) not."""
    for fut, err in done:
        if fut.done():
            continue
        if err is None:
            fut.set_result(None)
        else:
            fut.set_exception(err)


class InlineCommit:
    """`add((rec, future, loop))` from the event loop it `serves`; the future is resolved by
    that loop's commit at the end of this iteration, or by the writer thread after `handoff`."""

    def __init__(self, engine: Engine, handoff: Callable[[list[tuple]], None], checkpoint: Callable[[], None],
                 metrics: Any = None) -> None:
        self._conn = engine.raw_connection()
        cur = self._conn.cursor()
        cur.execute("PRAGMA busy_timeout=0")
        cur.execute("PRAGMA wal_autocheckpoint=0")
        cur.close()
        self._conn.commit()
        self._rows = RowWriter(engine.dialect.name, engine.dialect.paramstyle)
        self._handoff = handoff
        self._checkpoint = checkpoint
        self._metrics = metrics
        self._pending: list[tuple] = []
        self._loop: Any = None
        self._since_checkpoint = 0
        self.committed = 0

    @property
    def depth(self) -> int:
        return len(self._pending)

    def serves(self, loop: Any) -> bool:
        """Whether calls from `loop` are committed here: the first loop that asks, only (the
        pending batch is that loop's alone; another loop's calls go to the writer thread)."""
        if self._loop is None:
            self._loop = loop
        return self._loop is loop

    def add(self, item: tuple) -> None:
        self._pending.append(item)
        if len(self._pending) == 1:
            self._loop.call_soon(self._flush)

    def close(self) -> None:
        if self._pending:
            self._flush()
        self._conn.close()

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        t0 = time.perf_counter()
        try:
            cur = self._conn.cursor()
            outcomes = self._rows.write(cur, [item[0] for item in batch], time.time())
            cur.close()
            self._conn.commit()
        except Exception as exc:  # noqa: BLE001 - the writer thread retries with its full logic
            log.debug("recorder: inline commit of %d calls handed to the writer thread: %s", len(batch), exc)
            self._rows.unassigned_ok = False
            try:
                self._conn.rollback()
            except Exception:  # noqa: BLE001 - the writer thread reports what is wrong
                pass
            self._handoff(batch)
        else:
            if self._metrics is not None:
                self._metrics.commit(time.perf_counter() - t0)
            self.committed += sum(out is None for out in outcomes)
            resolve([(item[1], out) for item, out in zip(batch, outcomes)])
        # a batch handed over is written to the same WAL (by the writer thread): it counts too
        self._since_checkpoint += len(batch)
        if self._since_checkpoint >= CHECKPOINT_CALLS:
            self._since_checkpoint -= CHECKPOINT_CALLS
            self._checkpoint()
