"""Durable call recording with group commit.

A call's response is released only after its row is committed. To make that cheap under
load, one writer thread owns a DB connection and commits whatever has queued up while the
previous commit ran, in one transaction (group commit; while calls arrive concurrently it waits
up to `window_s` for more); each request awaits its batch.

`seq` is allocated in the same transaction from the rollout row (`record.call_rows`): the row lock
(PostgreSQL) or the write lock (SQLite) makes this safe with several proxy processes on one DB,
and a call that extends an earlier one always gets a larger seq because the earlier one was
committed before its response was released. A rollout whose row someone else holds locked is
skipped, not waited for: its calls are retried on their own (for up to `busy_s`, then a
retryable 503) while every other rollout's calls keep committing.

A call answered 503 (the DB away, its rollout row locked) is journaled as a failed call
(`record/failed_call_journal.py`) before the answer goes out, and written back once the DB takes it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from harnessrl.proxy.record.batch_writer import UNRECORDED, BatchWriter, Lost
from harnessrl.proxy.record.call_rows import BUSY, CallRecord, RecordError, RolloutFinished
from harnessrl.proxy.record.inline_commit import Checkpointer, InlineCommit, inline_capable, resolve
from harnessrl.proxy.record.failed_call_journal import DEFAULT_MAX_BYTES, Spill, default_dir

__all__ = ["CallRecord", "DatabaseUnavailable", "RecordError", "Recorder", "RolloutBusy", "RolloutFinished"]
log = logging.getLogger("harnessrl.proxy.recorder")


class DatabaseUnavailable(RecordError):
    """The records DB cannot be reached now; the harness may retry the call (503)."""


class RolloutBusy(DatabaseUnavailable):
    """The call's rollout row stayed locked by someone else for `busy_s`; retry the call (503)."""


_MIN_BACKOFF, _MAX_BACKOFF = 0.05, 1.0
_UNAVAILABLE = "the records database is unavailable; retry the call"
_LOCKED = "the rollout's database row is locked by another session; retry the call"
_BUSY_POLL = 0.02  # how soon a call whose rollout row is locked is tried again
# Group commit window: while calls arrive concurrently (the last batch had several), the writer
# waits this long for more before committing. Each commit has a fixed cost (the rollout row,
# the WAL frames of every index page it touches) that a larger batch shares; a lone caller
# (last batch of one) never waits. Under load the proxy is CPU-bound, so the CPU saved is
# throughput gained, and latency (clients / throughput) does not grow.
_WINDOW = 0.001
_CHECKPOINT = object()  # queued by the inline committer: the writer thread checkpoints the WAL


class Recorder:
    """Owns the writer thread; `await recorder.commit(rec)` returns once `rec` is durable.

    On a SQLite file, calls are committed on the event loop's thread instead
    (`record.inline_commit`), and only a batch that cannot be written there comes to the writer thread.

    The writer survives a lost connection (server restart, failover, terminated or reaped
    backend): the batch it was writing is retried on a fresh connection for up to `retry_s`
    (rows a commit lost in flight may already be in; those are found by id, never written
    twice), then its calls fail with `DatabaseUnavailable`. While the DB stays away, later
    batches fail at once, with reconnects spaced by exponential backoff. Calls answered that
    way go to the failed-call journal in `spill_dir` (default: `record.failed_call_journal.default_dir`) and are
    written as failed calls once the DB is back; while the rows waiting there reach
    `spill_max_bytes`, `admit()` turns new calls away."""

    def __init__(self, engine: Engine, max_batch: int = 1024, retry_s: float = 2.0, busy_s: float = 5.0,
                 metrics: Any = None, window_s: float = _WINDOW, spill_dir: Path | None = None,
                 spill_max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._engine = engine
        self._max_batch = max_batch
        self._window_s = window_s
        self._last_batch = 0
        self._retry_s = retry_s
        self._busy_s = busy_s
        self._metrics = metrics  # `prometheus.RecorderMetrics`-like: commit latency, DB errors (or None)
        self._db = BatchWriter(engine, self._db_error)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: list[tuple[tuple, float]] = []  # (queue item, when first BUSY): rollout row locked
        self._conn = engine.raw_connection()  # opened here so a bad DB fails at start, not per call
        self._state, self._last_error = "ok", None
        self._next_try, self._backoff = 0.0, _MIN_BACKOFF
        self._checkpoint_due = False
        self.checkpoints = Checkpointer()
        self._spill = Spill(spill_dir or default_dir(engine.url), spill_max_bytes, metrics)
        if metrics is not None:
            metrics.watch_spill(lambda: self._spill.rows, lambda: self._spill.bytes)
        self._committed = 0  # by the writer thread
        self._inline = (InlineCommit(engine, self._take_over, lambda: self._queue.put(_CHECKPOINT), metrics)
                        if inline_capable(engine) else None)
        self._thread = threading.Thread(target=self._run, name="harnessrl-recorder", daemon=True)
        self._thread.start()

    async def commit(self, rec: CallRecord) -> None:
        if not self._thread.is_alive():
            raise RecordError("the recorder is stopped")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self._inline is not None and self._state == "ok" and self._inline.serves(loop):
            self._inline.add((rec, fut, loop))
        else:
            self._queue.put((rec, fut, loop))
        await fut

    def admit(self) -> bool:
        """Whether a new model call may start: not while the failed-call journal is full (its
        record could not be kept); the caller answers it 503 `database_unavailable`."""
        if not self._spill.full:
            return True
        if self._metrics is not None:
            self._metrics.spill_refused()
        return False

    def submit(self, rec: CallRecord) -> None:
        """Record `rec` with nobody waiting for it (a stream the harness abandoned: its task may
        already be cancelled); an error is only logged."""
        self._queue.put((rec, None, None))

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize() + len(self._waiting) + (self._inline.depth if self._inline is not None else 0)

    @property
    def committed(self) -> dict[str, int]:
        """Calls committed so far, by the event loop's thread ("inline") and the writer thread."""
        return {"inline": self._inline.committed if self._inline is not None else 0, "writer": self._committed}

    def health(self) -> dict[str, Any]:
        """The writer's state for readiness probes: `writer` is "ok", "reconnecting" (the DB
        connection is lost; calls get 503) or "stopped"; `last_error` the class name of the last
        connection error (no database text); `queue` calls waiting for a commit; `backlog`
        failed calls in the journal, waiting to be written."""
        writer = self._state if self._thread.is_alive() else "stopped"
        return {"writer": writer, "last_error": self._last_error, "queue": self._queue.qsize(),
                "backlog": self._spill.rows}

    def close(self) -> None:
        if self._inline is not None:
            self._inline.close()
        self._queue.put(None)
        self._thread.join(timeout=30)

    # writer thread
    def _run(self) -> None:
        try:
            stop = False
            while not stop:
                batch, since, stop = self._take()
                if batch:
                    self._write_and_answer(batch, since, stop)
                if not stop and self._spill.due():
                    try:
                        self._write_back()
                    except Exception:  # noqa: BLE001 - the writer must outlive the journal; kept for later
                        log.exception("recorder: unexpected error writing back the failed-call journal")
                        self._spill.untake()
                # after the batch: a batch handed over with the request is part of what it copies
                if self._checkpoint_due and self._conn is not None:
                    self.checkpoints(self._conn)
                self._checkpoint_due = False
        finally:
            self._spill.close()
            if self._conn is not None:
                self._conn.close()

    def _write_and_answer(self, batch: list[tuple], since: list[float | None], stop: bool) -> None:
        recs = [b[0] for b in batch]
        t0 = time.perf_counter()
        try:
            outcomes = self._commit_batch(recs)
        except Exception:  # noqa: BLE001 - the writer must outlive any one batch
            log.exception("recorder: unexpected error writing calls %s", [r.id for r in recs])
            outcomes = [RecordError(UNRECORDED)] * len(recs)
        if self._metrics is not None:
            self._metrics.commit(time.perf_counter() - t0)
        self._committed += sum(e is None for e in outcomes)
        self._answer(batch, since, outcomes, stop)

    def _take(self) -> tuple[list[tuple], list[float | None], bool]:
        """The next batch: calls waiting on a locked rollout row, then what has queued up (a short
        wait when some are waiting, so they are retried soon; up to the window for more when the
        last batch had several); and whether close() was called."""
        waiting, self._waiting = self._waiting, []
        batch = [w[0] for w in waiting]
        since: list[float | None] = [w[1] for w in waiting]
        wait = self._spill.wait_s()  # journaled calls to write back: wake up for them
        if batch:
            wait = _BUSY_POLL if wait is None else min(wait, _BUSY_POLL)
        try:
            item = self._queue.get(timeout=wait) if wait is None or wait > 0 else self._queue.get_nowait()
        except queue.Empty:
            return batch, since, False
        deadline = None
        while item is not None:
            if item is _CHECKPOINT:
                self._checkpoint_due = True
            else:
                batch.append(item)
                since.append(None)
            if len(batch) >= self._max_batch:
                break
            try:
                item = self._queue.get_nowait()
                continue
            except queue.Empty:
                pass
            if self._last_batch < 2 or self._window_s <= 0:
                break
            deadline = deadline or time.monotonic() + self._window_s
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                break
        self._last_batch = len(batch)
        return batch, since, item is None

    def _take_over(self, batch: list[tuple]) -> None:
        """A batch the inline committer could not write (lock held elsewhere, an error)."""
        for item in batch:
            self._queue.put(item)

    def _answer(self, batch: list[tuple], since: list[float | None], outcomes: list, stopping: bool) -> None:
        now = time.monotonic()
        by_loop: dict[Any, list] = {}
        locked = []
        for item, first, out in zip(batch, since, outcomes):
            rec, fut, loop = item
            if out is BUSY:
                first = now if first is None else first
                if now - first < self._busy_s and not stopping:
                    self._waiting.append((item, first))
                    continue
                if fut is not None:
                    # answered 503 now; journaled, so written as a failed call once the row is free
                    log.warning("recorder: call %s answered 503: its rollout row stayed locked", rec.id,
                                extra={"call_id": rec.id})
                    rec.status, rec.error = "error", f"503 server_error: {_LOCKED}" + (
                        f" (after {rec.error})" if rec.error else "")
                locked.append(rec)
                out = RolloutBusy(_LOCKED)
            if fut is None:
                # a RolloutFinished one is written, as failed; an unavailable DB's, journaled
                if out is not None and not isinstance(out, (RolloutFinished, DatabaseUnavailable)):
                    log.warning("recorder: call %s not recorded (%s)", rec.id, out, extra={"call_id": rec.id})
                continue
            by_loop.setdefault(loop, []).append((fut, out))
        if locked:
            self._spill.append(locked)  # before the 503s go out
        for loop, done in by_loop.items():
            loop.call_soon_threadsafe(resolve, done)

    def _commit_batch(self, recs: list[CallRecord]) -> list[Any]:
        # a batch that meets a lost connection gets `retry_s` to reconnect; while the DB is
        # known to be away, a batch gets one try (if the backoff allows one) and fails fast
        deadline = time.monotonic() + (self._retry_s if self._state == "ok" else 0.0)
        retried = False
        while True:
            try:
                conn = self._connect()
                if not retried:
                    return self._db.write(conn, recs)
                present = self._db.present(conn, recs)
                errors = self._db.write(conn, [r for r in recs if r.id not in present])
                it = iter(errors)
                return [None if r.id in present else next(it) for r in recs]
            except Lost as lost:
                self._down(lost.__cause__, recs)
            retried = True
            wait = self._next_try - time.monotonic()
            if time.monotonic() + max(wait, 0.0) > deadline:
                self._defer(recs)
                return [DatabaseUnavailable(_UNAVAILABLE)] * len(recs)
            time.sleep(max(wait, 0.0))

    def _connect(self):
        if self._conn is not None:
            return self._conn
        now = time.monotonic()
        if now < self._next_try:
            raise Lost
        try:
            conn = self._engine.raw_connection()  # pre-pinged by the pool
        except Exception as exc:  # noqa: BLE001 - any failure to connect: still away
            self._db_error()
            self._next_try, self._backoff = now + self._backoff, min(2 * self._backoff, _MAX_BACKOFF)
            raise Lost from exc
        self._conn, self._state, self._backoff = conn, "ok", _MIN_BACKOFF
        log.warning("recorder: reconnected to the records DB")
        self._spill.adopt()  # a proxy that stopped meanwhile may have left failed calls
        return conn

    def _down(self, exc: BaseException | None, recs: list[CallRecord]) -> None:
        if self._conn is not None:
            try:
                self._conn.invalidate()
            except Exception:  # noqa: BLE001 - it is being thrown away
                pass
            self._conn = None
        self._db.rows.unassigned_ok = False
        if exc is not None:
            self._last_error = type(exc).__name__
            if self._state == "ok":
                log.warning("recorder: records DB connection lost writing calls %s: %s", [r.id for r in recs], exc)
            else:
                log.debug("recorder: records DB still away: %s", exc)
        if self._state == "ok":
            self._state, self._next_try, self._backoff = "reconnecting", 0.0, _MIN_BACKOFF

    def _defer(self, recs: list[CallRecord]) -> None:
        """Journal calls about to be answered 503, to record them as failed once the DB is back."""
        log.warning("recorder: calls %s answered 503: the records DB is unavailable (%s)",
                    [r.id for r in recs], self._last_error)
        for r in recs:
            r.error = f"503 server_error: {_UNAVAILABLE}" + (f" (after {r.error})" if r.error else "")
            r.status = "error"
        self._spill.append(recs)

    def _write_back(self) -> None:
        """Write one chunk of the journal (between live batches, so a long journal does not hold
        up the calls being made now). Rows already in the DB are not written again."""
        recs = self._spill.take(self._max_batch)
        if not recs:
            return
        try:
            conn = self._connect()
            present = self._db.present(conn, recs)
            if present:  # committed, but the commit's answer was lost: the harness got a 503
                self._db.mark_failed(conn, [r for r in recs if r.id in present])
            todo = [r for r in recs if r.id not in present]
            outcomes = self._db.write(conn, todo)
        except Lost as lost:
            self._down(lost.__cause__, recs)
            self._spill.untake()
            return
        locked = [r for r, out in zip(todo, outcomes) if out is BUSY]
        refused = 0
        for r, out in zip(todo, outcomes):
            if out is not None and out is not BUSY and not isinstance(out, RolloutFinished):
                refused += 1  # e.g. its rollout was deleted meanwhile: it can never be written
                log.error("recorder: journaled failed call %s cannot be written: %s", r.id, out,
                          extra={"call_id": r.id})
        if refused and self._metrics is not None:
            self._metrics.spill_refused_by_db(refused)
        self._spill.settle(len(recs) - len(locked), locked)
        log.warning("recorder: wrote %d failed calls from the journal (%d waiting)",
                    len(recs) - len(locked) - refused, self._spill.rows)

    def _db_error(self) -> None:
        if self._metrics is not None:
            self._metrics.db_error()
