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
import operator
import queue
import threading
import time
from dataclasses import field, fields, make_dataclass
from typing import Any

import orjson
from sqlalchemy import JSON, Engine

from harnessrl.records import UNASSIGNED_ROLLOUT, Call


_CALLS = Call.__table__


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
_values = operator.attrgetter(*_COLUMNS)


class RecordError(Exception):
    """A call could not be recorded."""


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


class Recorder:
    """Owns the writer thread; `await recorder.commit(rec)` returns once `rec` is durable."""

    def __init__(self, engine: Engine, max_batch: int = 1024) -> None:
        self._engine = engine
        self._max_batch = max_batch
        mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
        cols = _COLUMNS + ["seq"]
        self._insert = f"INSERT INTO {_CALLS.name} ({', '.join(cols)}) VALUES ({', '.join([mark] * len(cols))})"
        self._bump = f"UPDATE rollouts SET next_seq = next_seq + {mark} WHERE id = {mark} RETURNING next_seq"
        self._ensure_unassigned = (
            f"INSERT INTO rollouts (id, status, next_seq, created_at) VALUES ({mark}, 'running', 0, {mark}) "
            "ON CONFLICT (id) DO NOTHING"
        )
        self._unassigned_ok = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._conn = engine.raw_connection()  # opened here so a bad DB fails at start, not per call
        self.committed = 0
        self._thread = threading.Thread(target=self._run, name="harnessrl-recorder", daemon=True)
        self._thread.start()

    async def commit(self, rec: CallRecord) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put((rec, fut, loop))
        await fut

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    # writer thread
    def _run(self) -> None:
        conn = self._conn
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
                errors = self._write(conn, [b[0] for b in batch])
                self.committed += sum(e is None for e in errors)
                by_loop: dict[Any, list] = {}
                for (_, fut, loop), err in zip(batch, errors):
                    by_loop.setdefault(loop, []).append((fut, err))
                for loop, done in by_loop.items():
                    loop.call_soon_threadsafe(_resolve, done)
                if stop:
                    return
        finally:
            conn.close()

    def _write(self, conn, recs: list[CallRecord]) -> list[Exception | None]:
        try:
            errors = self._write_batch(conn, recs)
            conn.commit()
            return errors
        except Exception:  # noqa: BLE001 - isolate the bad row: retry one by one
            conn.rollback()
        if len(recs) == 1:
            return [self._write_one(conn, recs[0])]
        return [self._write_one(conn, r) for r in recs]

    def _write_one(self, conn, rec: CallRecord) -> Exception | None:
        try:
            (err,) = self._write_batch(conn, [rec])
            conn.commit()
            return err
        except Exception as exc:  # noqa: BLE001 - reported to the waiting request
            conn.rollback()
            return RecordError(f"could not record the call: {exc}")

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
