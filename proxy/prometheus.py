"""`GET /metrics`: the proxy's counters in the Prometheus text format (prometheus-client).

Each app has its own `CollectorRegistry` (several proxies in one process must not share
counters). The hot path pays a dict lookup and two or three increments a call; gauges that
are state elsewhere (recorder queue, prefix-index bytes, rollouts running) are read at scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import Engine, func, select

from harnessrl.db import sqlite_file
from harnessrl.records import UNASSIGNED_ROLLOUT, Rollout

log = logging.getLogger("harnessrl.proxy.calls")
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class _RunningRollouts:
    """Rollouts running in the records DB (all proxies'), counted at scrape time."""

    def __init__(self, engine: Engine, on_error: Callable[[], None]) -> None:
        self._engine = engine
        self._on_error = on_error

    def collect(self):
        q = select(func.count()).select_from(Rollout).where(Rollout.status == "running",
                                                             Rollout.id != UNASSIGNED_ROLLOUT)
        try:
            with self._engine.connect() as conn:
                n = conn.execute(q).scalar_one()
        except Exception as exc:  # noqa: BLE001 - a scrape while the DB is away: the gauge is left out
            log.warning("metrics: cannot count running rollouts: %s", exc)
            self._on_error()
            return
        yield GaugeMetricFamily("harnessrl_rollouts_running", "Rollouts with status running in the records DB",
                                value=n)


class ProxyMetrics:
    def __init__(self, engine: Engine) -> None:
        self.registry = r = CollectorRegistry()
        self._calls = Counter("harnessrl_proxy_calls", "Model calls answered, by endpoint, API surface and "
                              "outcome (ok, error, cancelled); refused calls are errors",
                              ["endpoint", "surface", "status"], registry=r)
        # the HTTP status only: error codes may come from an upstream (unbounded label values)
        self._refused = Counter("harnessrl_proxy_refused", "Model calls refused before they reached the model "
                                "(auth, body, identity, finished rollout, ...), by API surface and HTTP status",
                                ["surface", "http_status"], registry=r)
        self._latency = Histogram("harnessrl_proxy_call_seconds", "Call latency, request to recorded answer",
                                  ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r)
        self._model = Histogram("harnessrl_proxy_upstream_seconds", "Time in the upstream or the local model "
                                "(calls it answered)", ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r)
        self._commit = Histogram("harnessrl_recorder_commit_seconds", "Time to write one batch of calls "
                                 "(group commit)", buckets=_COMMIT_BUCKETS, registry=r)
        self._db_errors = Counter("harnessrl_db_errors", "Failed records-DB statements and connects", registry=r)
        self._queue = Gauge("harnessrl_recorder_queue", "Calls waiting to be committed", registry=r)
        self._prefix = Gauge("harnessrl_prefix_index_bytes", "Memory held by the prefix index (its estimate)",
                             registry=r)
        # the failed-call journal (`record/failed_call_journal.py`): rows and bytes waiting for the DB; calls turned
        # away while it is full; rows lost (the journal could not be written) or refused by the DB
        self._spill_rows = Gauge("harnessrl_spill_rows", "Failed calls in the journal, waiting for the records DB",
                                 registry=r)
        self._spill_bytes = Gauge("harnessrl_spill_bytes", "Bytes of the failed calls in the journal (bounded by "
                                  "--spill-max-mb)", registry=r)
        self._spill_refused = Counter("harnessrl_spill_refused_calls", "Model calls refused with 503 because the "
                                      "failed-call journal was full", registry=r)
        self._spill_dropped = Counter("harnessrl_spill_dropped_calls", "Failed calls lost: the journal file could "
                                      "not be written (disk full, permissions); 0 in normal operation", registry=r)
        self._spill_rejected = Counter("harnessrl_spill_rejected_calls", "Journaled failed calls the records DB "
                                       "refused for good when written back (logged with the call id)", registry=r)
        r.register(_RunningRollouts(engine, self.db_error))
        if (db_file := sqlite_file(engine)) is not None:
            # the checkpoints keep it bounded; a reader of an old snapshot makes it grow meanwhile
            wal = db_file.with_name(db_file.name + "-wal")
            Gauge("harnessrl_sqlite_wal_bytes", "Size of the SQLite records DB's write-ahead log file",
                  registry=r).set_function(lambda: wal.stat().st_size if wal.exists() else 0)
        self._children: dict[tuple, tuple] = {}

    def watch(self, queue_depth: Callable[[], float], prefix_bytes: Callable[[], float]) -> None:
        """The gauges read at scrape time (set once the recorder and the index exist)."""
        self._queue.set_function(queue_depth)
        self._prefix.set_function(prefix_bytes)

    def call(self, endpoint: str, surface: str, status: str, total_s: float, model_s: float | None) -> None:
        key = (endpoint, surface, status)
        c = self._children.get(key)
        if c is None:  # labels() validates and locks; resolved once per (endpoint, surface, status)
            c = self._children[key] = (self._calls.labels(endpoint, surface, status), self._latency.labels(endpoint),
                                       self._model.labels(endpoint))
        c[0].inc()
        c[1].observe(total_s)
        if model_s is not None:
            c[2].observe(model_s)

    def refused(self, surface: str, http_status: int) -> None:
        self._refused.labels(surface, str(http_status)).inc()

    # the recorder's hooks (called on its writer thread)
    def commit(self, seconds: float) -> None:
        self._commit.observe(seconds)

    def db_error(self) -> None:
        self._db_errors.inc()

    def watch_spill(self, rows: Callable[[], float], nbytes: Callable[[], float]) -> None:
        self._spill_rows.set_function(rows)
        self._spill_bytes.set_function(nbytes)

    def spill_refused(self) -> None:  # on the event loop
        self._spill_refused.inc()

    def spill_dropped(self, n: int) -> None:
        self._spill_dropped.inc(n)

    def spill_refused_by_db(self, n: int) -> None:
        self._spill_rejected.inc(n)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
