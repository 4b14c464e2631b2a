"""Writing call rows on one connection of the recorder's: a batch in one transaction, and when
that fails, row by row so one bad row fails alone; a failure that shows the connection is gone
raises `Lost` instead, so the recorder reconnects (and finds what a lost commit already wrote)."""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import Engine

from harnessrl.proxy.record.call_rows import CallRecord, RecordError, RowWriter

log = logging.getLogger("harnessrl.proxy.recorder")
UNRECORDED = "the records database refused it (the proxy log has the reason for this call id)"


class Lost(Exception):
    """The writer's connection is gone (or cannot be opened yet)."""


class BatchWriter:
    """Row writes for the recorder's writer thread; `on_db_error()` counts each DB error (metrics)."""

    def __init__(self, engine: Engine, on_db_error) -> None:
        self._engine = engine
        self._dbapi_error = engine.dialect.loaded_dbapi.Error
        self._on_db_error = on_db_error
        self.rows = RowWriter(engine.dialect.name, engine.dialect.paramstyle)

    def mark_failed(self, conn, recs: list[CallRecord]) -> None:
        # the harness got a 503 for these: each counts as its rollout's error, once
        self._in_transaction(conn, lambda cur: self.rows.mark_failed(cur, recs))

    def present(self, conn, recs: list[CallRecord]) -> set[str]:
        """Ids among `recs` already committed (a commit cut off in flight may have landed)."""
        return self._in_transaction(conn, lambda cur: self.rows.present(cur, [r.id for r in recs]))

    @staticmethod
    def _in_transaction(conn, run):
        try:
            cur = conn.cursor()
            out = run(cur)
            cur.close()
            conn.commit()
            return out
        except Exception as exc:  # noqa: BLE001 - only a lost connection is expected here
            raise Lost from exc

    def write(self, conn, recs: list[CallRecord]) -> list[Any]:
        if not recs:
            return []
        try:
            errors = self._batch(conn, recs)
            conn.commit()
            return errors
        except Exception as exc:  # noqa: BLE001 - isolate the bad row: retry one by one
            self._rollback(conn, exc)
        return [self._write_one(conn, r) for r in recs]

    def _write_one(self, conn, rec: CallRecord) -> Exception | None:
        try:
            (err,) = self._batch(conn, [rec])
            conn.commit()
            return err
        except Exception as exc:  # noqa: BLE001 - reported to the waiting request
            self._rollback(conn, exc)
            log.warning("recorder: call %s not recorded: %s", rec.id, exc)
            return RecordError(UNRECORDED)

    def _rollback(self, conn, exc: Exception) -> None:
        """Roll back after `exc`; raise `Lost` if `exc` (or the rollback) shows the
        connection is gone."""
        self.rows.unassigned_ok = False
        self._on_db_error()
        dbapi_conn = conn.dbapi_connection
        if dbapi_conn is None or (isinstance(exc, self._dbapi_error)
                                  and self._engine.dialect.is_disconnect(exc, dbapi_conn, None)):
            raise Lost from exc
        try:
            conn.rollback()
        except Exception as rb_exc:  # noqa: BLE001 - a rollback that fails: the connection is gone
            raise Lost from rb_exc

    def _batch(self, conn, recs: list[CallRecord]) -> list[Any]:
        cur = conn.cursor()
        outcomes = self.rows.write(cur, recs, time.time())
        cur.close()
        return outcomes
