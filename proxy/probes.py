"""`GET /health` (liveness: the process answers) and `GET /ready` (readiness: the records DB
answers, the recorder's writer is alive, the local backend is loaded or the upstream answers),
in the shapes load balancers and Kubernetes probes expect: 200 when ready, 503 with the failing
checks when not. Neither needs the API key: probes carry none, and neither reveals records.
`GET /metrics` (the Prometheus scrape, `prometheus.ProxyMetrics`) is behind the key."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import orjson
from fastapi import FastAPI, Request
from sqlalchemy import Engine, text
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from harnessrl.proxy.errors import ProxyError, error_response
from harnessrl.proxy.identity import operator_only
from harnessrl.proxy.lifespan import Lifespan
from harnessrl.proxy.prometheus import ProxyMetrics

log = logging.getLogger("harnessrl.proxy")
UPSTREAM_PROBE_S = 2.0


def _db_answers(engine: Engine) -> bool:
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return True
    except Exception as exc:  # noqa: BLE001 - any failure means not ready; the reason goes to the log
        log.warning("readiness: records DB unreachable: %s", exc)
        return False


def add_probes(app: FastAPI, engine: Engine, running: Lifespan, local_backend: Any) -> None:
    """`running`: the app's lifespan, whose `recorder` and `pool` exist once it has started."""

    @app.get("/health")
    def health() -> Response:
        # the process that answered: with --workers each has its own metrics and prefix index
        return Response(orjson.dumps({"status": "ok", "worker": os.getpid()}), 200, media_type="application/json")

    @app.get("/ready")
    async def ready() -> Response:
        checks: dict[str, str] = {"database": "ok" if await run_in_threadpool(_db_answers, engine) else "unreachable"}
        recorder = running.recorder
        checks["writer"] = recorder.health()["writer"] if recorder is not None else "not started"
        ups = running.upstreams
        if local_backend is not None:
            checks["backend"] = "ok"
        elif ups is not None:  # ready while one upstream takes calls; each one's state and load below
            checks["upstreams"] = "ok" if any(u.up for u in ups.all) else "all down"
        elif running.pool is not None:
            checks["upstream"] = await _upstream(running.pool)
        ok = all(v == "ok" for v in checks.values())
        body = {"status": "ready" if ok else "not_ready", "checks": checks}
        if ups is not None:
            body["upstreams"] = ups.snapshot()
        return Response(orjson.dumps(body), 200 if ok else 503, media_type="application/json")


def add_metrics(app: FastAPI, api_key: str | None, metrics: ProxyMetrics) -> None:

    @app.get("/metrics")
    def prometheus(request: Request) -> Response:
        try:
            operator_only(request.headers, api_key)  # rollouts' traffic of every rollout: the operator's
        except ProxyError as err:
            return error_response(err)
        body, content_type = metrics.render()
        return Response(body, 200, media_type=content_type)


async def _upstream(pool: Any) -> str:
    try:
        resp = await asyncio.wait_for(pool.request("GET", "/v1/models"), UPSTREAM_PROBE_S)
    except Exception:  # noqa: BLE001 - unreachable, refused or too slow: not ready
        return "unreachable"
    # 401/403: a missing or wrong --upstream-api-key; every call would fail
    return "ok" if resp.status < 500 and resp.status not in (401, 403) else f"status {resp.status}"
