"""Durable call recording with group commit.

A call's response is released only after its row is committed. To make that cheap under
load, one writer thread owns a DB connection and commits whatever has queued up while the
previous commit ran, in one transaction (group commit); each request awaits its batch.

`seq` is allocated in the same transaction with `UPDATE rollouts SET next_seq = next_seq + n
... RETURNING next_seq`: the row lock (PostgreSQL) or the write lock (SQLite) makes this safe
with several proxy processes on one DB, and a call that extends an earlier one always gets a
larger seq because the earlier one was committed before its response was released.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import queue
import threading
import time
from collections import deque
from dataclasses import field, fields, make_dataclass
from typing import Any

import orjson
from sqlalchemy import JSON, Engine

from harnessrl.records import UNASSIGNED_ROLLOUT, Call, NulSafeText, escape_nul


_CALLS = Call.__table__
log = logging.getLogger("harnessrl.proxy.recorder")


def _record_class() -> type:
    """A slots dataclass with one field per column of `calls` but `seq` (allocated at commit):
    cheap to build on the hot path, and defined by the ORM table alone. Non-null columns without
    a default are required keywords; the rest default to the column's default, else None."""
    spec: list[tuple] = []
    for c in _CALLS.columns:
        if c.name == "seq":
            continue
        if c.default is not None:
            spec.append((c.name, Any, field(default=c.default.arg)))
        elif c.nullable:
            spec.append((c.name, Any, field(default=None)))
        else:
            spec.append((c.name, Any))
    cls = make_dataclass("CallRecord", spec, slots=True, kw_only=True)
    cls.__module__ = __name__
    return cls


CallRecord = _record_class()
_COLUMNS = [f.name for f in fields(CallRecord)]
_JSON_AT = [i for i, name in enumerate(_COLUMNS) if isinstance(_CALLS.c[name].type, JSON)]
# written raw, so escaped here as the ORM type would (model text may hold U+0000)
_NUL_SAFE_AT = [i for i, name in enumerate(_COLUMNS) if isinstance(_CALLS.c[name].type, NulSafeText)]
_values = operator.attrgetter(*_COLUMNS)


class RecordError(Exception):
    """A call could not be recorded. Its message is safe to show the harness: database error
    text is logged with the call id, never put here."""


class DatabaseUnavailable(RecordError):
    """The records DB cannot be reached now; the harness may retry the call (503)."""


class _Lost(Exception):
    """The writer's connection is gone (or cannot be opened yet)."""


_MIN_BACKOFF, _MAX_BACKOFF = 0.05, 1.0
_UNRECORDED = "the records database refused it (the proxy log has the reason for this call id)"
_UNAVAILABLE = "the records database is unavailable; retry the call"


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


class Recorder:
    """Owns the writer thread; `await recorder.commit(rec)` returns once `rec` is durable.

    The writer survives a lost connection (server restart, failover, terminated or reaped
    backend): the batch it was writing is retried on a fresh connection for up to `retry_s`
    (rows a commit lost in flight may already be in; those are found by id, never written
    twice), then its calls fail with `DatabaseUnavailable`. While the DB stays away, later
    batches fail at once, with reconnects spaced by exponential backoff. Calls answered that
    way are kept (up to `backlog`) and written as failed calls once the DB is back."""

    def __init__(self, engine: Engine, max_batch: int = 1024, retry_s: float = 2.0, backlog: int = 10_000) -> None:
        self._engine = engine
        self._max_batch = max_batch
        self._retry_s = retry_s
        mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
        self._mark = mark
        cols = _COLUMNS + ["seq"]
        self._insert = f"INSERT INTO {_CALLS.name} ({', '.join(cols)}) VALUES ({', '.join([mark] * len(cols))})"
        self._bump = f"UPDATE rollouts SET next_seq = next_seq + {mark} WHERE id = {mark} RETURNING next_seq"
        self._ensure_unassigned = (
            f"INSERT INTO rollouts (id, status, next_seq, created_at) VALUES ({mark}, 'running', 0, {mark}) "
            "ON CONFLICT (id) DO NOTHING"
        )
        self._unassigned_ok = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._dbapi_error = engine.dialect.loaded_dbapi.Error
        self._conn = engine.raw_connection()  # opened here so a bad DB fails at start, not per call
        self._state, self._last_error = "ok", None
        self._next_try, self._backoff = 0.0, _MIN_BACKOFF
        self._backlog: deque[CallRecord] = deque(maxlen=backlog)
        self.committed = 0
        self._thread = threading.Thread(target=self._run, name="harnessrl-recorder", daemon=True)
        self._thread.start()

    async def commit(self, rec: CallRecord) -> None:
        if not self._thread.is_alive():
            raise RecordError("the recorder is stopped")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put((rec, fut, loop))
        await fut

    def health(self) -> dict[str, Any]:
        """The writer's state for readiness probes: `writer` is "ok", "reconnecting" (the DB
        connection is lost; calls get 503) or "stopped"; `last_error` the class name of the last
        connection error (no database text); `queue` calls waiting for a commit; `backlog`
        failed calls waiting for the DB to come back."""
        writer = self._state if self._thread.is_alive() else "stopped"
        return {"writer": writer, "last_error": self._last_error, "queue": self._queue.qsize(),
                "backlog": len(self._backlog)}

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    # writer thread
    def _run(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                batch = [item]
                stop = False
                while len(batch) < self._max_batch:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop = True
                        break
                    batch.append(nxt)
                recs = [b[0] for b in batch]
                try:
                    errors = self._commit_batch(recs)
                except Exception:  # noqa: BLE001 - the writer must outlive any one batch
                    log.exception("recorder: unexpected error writing calls %s", [r.id for r in recs])
                    errors = [RecordError(_UNRECORDED)] * len(recs)
                self.committed += sum(e is None for e in errors)
                by_loop: dict[Any, list] = {}
                for (_, fut, loop), err in zip(batch, errors):
                    by_loop.setdefault(loop, []).append((fut, err))
                for loop, done in by_loop.items():
                    loop.call_soon_threadsafe(_resolve, done)
                if stop:
                    return
        finally:
            if self._conn is not None:
                self._conn.close()

    def _commit_batch(self, recs: list[CallRecord]) -> list[Exception | None]:
        # a batch that meets a lost connection gets `retry_s` to reconnect; while the DB is
        # known to be away, a batch gets one try (if the backoff allows one) and fails fast
        deadline = time.monotonic() + (self._retry_s if self._state == "ok" else 0.0)
        retried = False
        while True:
            try:
                conn = self._connect()
                if not retried:
                    return self._write(conn, recs)
                present = self._present(conn, recs)
                errors = self._write(conn, [r for r in recs if r.id not in present])
                it = iter(errors)
                return [None if r.id in present else next(it) for r in recs]
            except _Lost as lost:
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
            raise _Lost
        try:
            conn = self._engine.raw_connection()  # pre-pinged by the pool
        except Exception as exc:  # noqa: BLE001 - any failure to connect: still away
            self._next_try, self._backoff = now + self._backoff, min(2 * self._backoff, _MAX_BACKOFF)
            raise _Lost from exc
        self._conn, self._state, self._backoff = conn, "ok", _MIN_BACKOFF
        log.warning("recorder: reconnected to the records DB")
        self._flush_backlog(conn)
        return conn

    def _down(self, exc: BaseException | None, recs: list[CallRecord]) -> None:
        if self._conn is not None:
            try:
                self._conn.invalidate()
            except Exception:  # noqa: BLE001 - it is being thrown away
                pass
            self._conn = None
        self._unassigned_ok = False
        if exc is not None:
            self._last_error = type(exc).__name__
            if self._state == "ok":
                log.warning("recorder: records DB connection lost writing calls %s: %s", [r.id for r in recs], exc)
            else:
                log.debug("recorder: records DB still away: %s", exc)
        if self._state == "ok":
            self._state, self._next_try, self._backoff = "reconnecting", 0.0, _MIN_BACKOFF

    def _defer(self, recs: list[CallRecord]) -> None:
        """Keep calls answered 503 to record them as failed once the DB is back."""
        log.warning("recorder: calls %s answered 503: the records DB is unavailable (%s)",
                    [r.id for r in recs], self._last_error)
        if len(self._backlog) + len(recs) > (self._backlog.maxlen or 0):
            log.warning("recorder: backlog full; the oldest failed calls will not be recorded")
        for r in recs:
            r.error = f"503 server_error: {_UNAVAILABLE}" + (f" (after {r.error})" if r.error else "")
            r.status = "error"
            self._backlog.append(r)

    def _flush_backlog(self, conn) -> None:
        pending = list(self._backlog)
        self._backlog.clear()
        if not pending:
            return
        try:
            present = self._present(conn, pending)
            if present:  # committed, but the commit's answer was lost: the harness got a 503
                self._mark_failed(conn, [r for r in pending if r.id in present])
            errors = self._write(conn, [r for r in pending if r.id not in present])
        except _Lost:
            self._backlog.extendleft(reversed(pending))
            raise
        log.warning("recorder: recorded %d calls answered 503 while the DB was away",
                    sum(e is None for e in errors))

    def _mark_failed(self, conn, recs: list[CallRecord]) -> None:
        try:
            cur = conn.cursor()
            m = self._mark
            cur.executemany(f"UPDATE {_CALLS.name} SET status = {m}, error = {m} WHERE id = {m}",
                            [(r.status, escape_nul(r.error), r.id) for r in recs])
            cur.close()
            conn.commit()
        except Exception as exc:  # noqa: BLE001 - only a lost connection is expected here
            raise _Lost from exc

    def _present(self, conn, recs: list[CallRecord]) -> set[str]:
        """Ids among `recs` already committed (a commit cut off in flight may have landed)."""
        try:
            cur = conn.cursor()
            cur.execute(f"SELECT id FROM {_CALLS.name} WHERE id IN ({', '.join([self._mark] * len(recs))})",
                        [r.id for r in recs])
            found = {row[0] for row in cur.fetchall()}
            cur.close()
            conn.commit()
            return found
        except Exception as exc:  # noqa: BLE001 - only a lost connection is expected here
            raise _Lost from exc

    def _write(self, conn, recs: list[CallRecord]) -> list[Exception | None]:
        if not recs:
            return []
        try:
            errors = self._write_batch(conn, recs)
            conn.commit()
            return errors
        except Exception as exc:  # noqa: BLE001 - isolate the bad row: retry one by one
            self._rollback(conn, exc)
        return [self._write_one(conn, r) for r in recs]

    def _write_one(self, conn, rec: CallRecord) -> Exception | None:
        try:
            (err,) = self._write_batch(conn, [rec])
            conn.commit()
            return err
        except Exception as exc:  # noqa: BLE001 - reported to the waiting request
            self._rollback(conn, exc)
            log.warning("recorder: call %s not recorded: %s", rec.id, exc)
            return RecordError(_UNRECORDED)

    def _rollback(self, conn, exc: Exception) -> None:
        """Roll back after `exc`; raise `_Lost` if `exc` (or the rollback) shows the
        connection is gone."""
        self._unassigned_ok = False
        dbapi_conn = conn.dbapi_connection
        if dbapi_conn is None or (isinstance(exc, self._dbapi_error)
                                  and self._engine.dialect.is_disconnect(exc, dbapi_conn, None)):
            raise _Lost from exc
        try:
            conn.rollback()
        except Exception as rb_exc:  # noqa: BLE001 - a rollback that fails: the connection is gone
            raise _Lost from rb_exc

    def _write_batch(self, conn, recs: list[CallRecord]) -> list[Exception | None]:
        cur = conn.cursor()
        now = time.time()
        if not self._unassigned_ok and any(r.rollout_id == UNASSIGNED_ROLLOUT for r in recs):
            cur.execute(self._ensure_unassigned, (UNASSIGNED_ROLLOUT, now))
            self._unassigned_ok = True
        by_rollout: dict[str, list[int]] = {}
        for i, r in enumerate(recs):
            by_rollout.setdefault(r.rollout_id, []).append(i)
        errors: list[Exception | None] = [None] * len(recs)
        rows = []
        # sorted: concurrent proxies lock rollout rows in the same order (no deadlock)
        for rid in sorted(by_rollout):
            idx = by_rollout[rid]
            cur.execute(self._bump, (len(idx), rid))
            got = cur.fetchall()
            if not got:
                for i in idx:
                    errors[i] = RecordError(f"rollout {rid!r} does not exist")
                continue
            seq = got[0][0] - len(idx)
            for i in idx:
                row = list(_values(recs[i]))
                for j in _JSON_AT:
                    row[j] = _json(row[j])
                for j in _NUL_SAFE_AT:
                    row[j] = escape_nul(row[j])
                row.append(seq)
                rows.append(row)
                seq += 1
        if rows:
            cur.executemany(self._insert, rows)
        cur.close()
        return errors


def _resolve(done: list) -> None:
    for fut, err in done:
        if fut.done():
            continue
        if err is None:
            fut.set_result(None)
        else:
            fut.set_exception(err)
