"""Writing one batch of call rows: per-rollout `seq` allocation that one locked rollout row
cannot stall, and the rollout's status checked in the same statement.

`seq` comes from the rollout row: `UPDATE rollouts SET next_seq = next_seq + n ... RETURNING`.
On PostgreSQL the row is taken with `FOR UPDATE SKIP LOCKED`, so a rollout row someone else
holds (another proxy's writer mid-commit, a `finish`, an operator's `SELECT … FOR UPDATE`) is
passed over: that rollout's calls come back `BUSY` for the recorder to retry on their own, and
every other rollout's calls commit now. SQLite has no row locks (one writer at a time, waiting
at most its busy_timeout), so it needs no skipping.

A call whose rollout is no longer running is written as a failed call (its row shows what was
attempted) and answered `RolloutFinished`.

A failed call (status `error`) adds one to its rollout's `errors` in the same statement that
allocates the seq, while the rollout runs: a rollout finished meanwhile keeps the count its
outcome was given with. A batch without failed calls runs the statement without `errors`, so
the column's index costs ok calls nothing.
"""

from __future__ import annotations

import operator
import os
import time
from dataclasses import field, make_dataclass
from typing import Any

import orjson
from sqlalchemy import JSON

from harnessrl.records import UNASSIGNED_ROLLOUT, Call, NulSafeText, escape_nul

CALLS = Call.__table__


class RecordError(Exception):
    """A call could not be recorded. Its message is safe to show the harness: database error
    text is logged with the call id, never put here."""


class RolloutFinished(RecordError):
    """The call's rollout was finished before the call could be recorded (410); the call is
    recorded as failed."""


# a call whose rollout row is locked by someone else: not written, to be retried
BUSY = object()


def new_call_id() -> str:
    """A fresh call id: 32 hex digits, the clock in nanoseconds then 8 random bytes.

    Time first, so a new id sorts after the ones before it and its primary-key insert lands at
    the right edge of the B-tree: fully random ids touch a random leaf page per insert, and a
    cold one once the index outgrows the cache (bench/record_cost.py: 0.82× the recording CPU
    per call and 1.45× the commits/s at 120k rows). The random half keeps ids unguessable and
    unique across proxy processes sharing one DB."""
    return f"{time.time_ns():016x}{os.urandom(8).hex()}"


def _record_class() -> type:
    """A slots dataclass with one field per column of `calls` but `seq` (allocated at commit):
    cheap to build on the hot path, and defined by the ORM table alone. Non-null columns without
    a default are required keywords; the rest default to the column's default, else None."""
    spec: list[tuple] = []
    for c in CALLS.columns:
        if c.name == "seq":
            continue
        if c.default is not None:
            spec.append((c.name, Any, field(default=c.default.arg)))
        elif c.nullable:
            spec.append((c.name, Any, field(default=None)))
        else:
            spec.append((c.name, Any))
    # not a column: `response` as JSON text when the answer's own encoding is it (`Serving.fill`)
    spec.append(("response_json", Any, field(default=None)))
    cls = make_dataclass("CallRecord", spec, slots=True, kw_only=True)
    cls.__module__ = "harnessrl.proxy.record.recorder"
    return cls


CallRecord = _record_class()
_COLUMNS = [c.name for c in CALLS.columns if c.name != "seq"]
_RESPONSE_AT = _COLUMNS.index("response")
_JSON_AT = [i for i, name in enumerate(_COLUMNS) if isinstance(CALLS.c[name].type, JSON)]
# written raw, so escaped here as the ORM type would (model text may hold U+0000)
_NUL_SAFE_AT = [i for i, name in enumerate(_COLUMNS) if isinstance(CALLS.c[name].type, NulSafeText)]
_values = operator.attrgetter(*_COLUMNS)


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def finished_error(rollout_id: str) -> str:
    return f"rollout {rollout_id!r} is finished"


class RowWriter:
    """The SQL of one dialect; `write(cur, recs, now)` runs in the writer's open transaction."""

    def __init__(self, dialect: str, paramstyle: str) -> None:
        m = "?" if paramstyle == "qmark" else "%s"
        self.mark = m
        cols = _COLUMNS + ["seq"]
        self._insert = f"INSERT INTO {CALLS.name} ({', '.join(cols)}) VALUES ({', '.join([m] * len(cols))})"
        row = f"(SELECT id FROM rollouts WHERE id = {m} FOR UPDATE SKIP LOCKED)" if dialect == "postgresql" else m
        self._skips_locked = dialect == "postgresql"
        self._bump = f"UPDATE rollouts SET next_seq = next_seq + {m} WHERE id = {row} RETURNING next_seq, status"
        self._bump_errors = (f"UPDATE rollouts SET next_seq = next_seq + {m}, "
                             f"errors = errors + CASE WHEN status = 'running' THEN {m} ELSE 0 END "
                             f"WHERE id = {row} RETURNING next_seq, status")
        self._exists = f"SELECT 1 FROM rollouts WHERE id = {m}"
        self._ensure_unassigned = (
            f"INSERT INTO rollouts (id, status, next_seq, created_at) VALUES ({m}, 'running', 0, {m}) "
            "ON CONFLICT (id) DO NOTHING"
        )
        self.unassigned_ok = False  # reset by the recorder after a rollback or a new connection

    def write(self, cur, recs: list, now: float) -> list[Any]:
        """Insert `recs`; per record None (written), a RecordError, or BUSY (not written)."""
        if not self.unassigned_ok and any(r.rollout_id == UNASSIGNED_ROLLOUT for r in recs):
            cur.execute(self._ensure_unassigned, (UNASSIGNED_ROLLOUT, now))
            self.unassigned_ok = True
        by_rollout: dict[str, list[int]] = {}
        for i, r in enumerate(recs):
            by_rollout.setdefault(r.rollout_id, []).append(i)
        outcomes: list[Any] = [None] * len(recs)
        rows = []
        # sorted: concurrent proxies lock rollout rows in the same order (no deadlock)
        for rid in sorted(by_rollout):
            idx = by_rollout[rid]
            failed = sum(recs[i].status == "error" for i in idx)
            if failed:
                cur.execute(self._bump_errors, (len(idx), failed, rid))
            else:
                cur.execute(self._bump, (len(idx), rid))
            got = cur.fetchall()
            if not got:
                missing = not (self._skips_locked and self._present(cur, rid))
                for i in idx:
                    outcomes[i] = RecordError(f"rollout {rid!r} does not exist") if missing else BUSY
                continue
            seq = got[0][0] - len(idx)
            finished = got[0][1] != "running"
            for i in idx:
                rec = recs[i]
                if finished:
                    outcomes[i] = RolloutFinished(finished_error(rid))
                    refused = f"410 invalid_request_error: {finished_error(rid)}"
                    if not (rec.error or "").startswith(refused):  # a batch retried row by row
                        rec.status = "error"
                        rec.error = refused + (f" (after {rec.error})" if rec.error else "")
                row = list(_values(rec))
                encoded = rec.response_json
                for j in _JSON_AT:
                    row[j] = encoded if j == _RESPONSE_AT and encoded is not None else _json(row[j])
                for j in _NUL_SAFE_AT:
                    row[j] = escape_nul(row[j])
                row.append(seq)
                rows.append(row)
                seq += 1
        if rows:
            cur.executemany(self._insert, rows)
        return outcomes

    def present(self, cur, ids: list[str]) -> set[str]:
        """Those of `ids` already in the calls table."""
        cur.execute(f"SELECT id FROM {CALLS.name} WHERE id IN ({', '.join([self.mark] * len(ids))})", ids)
        return {row[0] for row in cur.fetchall()}

    def mark_failed(self, cur, recs: list) -> None:
        """Rewrite committed calls as the failed calls they were answered as; each adds one to its
        running rollout's `errors` unless it already was failed (so a second replay adds nothing)."""
        m = self.mark
        cur.executemany(f"UPDATE rollouts SET errors = errors + 1 WHERE status = 'running' AND id = "
                        f"(SELECT rollout_id FROM {CALLS.name} WHERE id = {m} AND status <> 'error')",
                        [(r.id,) for r in recs])
        cur.executemany(f"UPDATE {CALLS.name} SET status = {m}, error = {m} WHERE id = {m}",
                        [(r.status, escape_nul(r.error), r.id) for r in recs])

    def _present(self, cur, rid: str) -> bool:
        # a plain read waits for no row lock: it tells a locked row from a missing one
        cur.execute(self._exists, (rid,))
        return bool(cur.fetchall())
