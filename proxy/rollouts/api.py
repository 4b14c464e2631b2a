"""The rollout API (`/harnessrl/rollouts...`, `/harnessrl/calls/{id}/reward`): create, list, read
and finish rollouts, and take outcome and process rewards (`harnessrl.client` speaks it). FastAPI
routes with pydantic bodies (`bodies`), behind the proxy's key."""

from __future__ import annotations

import orjson
from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from harnessrl.proxy.config import ProxyConfig
from harnessrl.proxy.identity import check_id, check_labels, key_required
from harnessrl.proxy.lifespan import Lifespan
from harnessrl.proxy.limits import check_metadata
from harnessrl.proxy.rollouts.bodies import CreateRollout, FinishIn, RewardIn
from harnessrl.proxy.rollouts.status import RolloutStatus
from harnessrl.proxy.rollouts.store import Rollouts, rollout_json


def _json(obj) -> Response:
    return Response(orjson.dumps(obj), 200, media_type="application/json")


def add_rollout_api(app: FastAPI, cfg: ProxyConfig, store: Rollouts, statuses: RolloutStatus,
                    running: Lifespan) -> None:
    """Add the rollout API's routes to `app`. `statuses` is the hot path's cache, kept in step on
    create and finish; `running.serving`'s prefix index forgets a finished rollout."""
    api = key_required(cfg.api_key)

    def _reward_ok(body: RewardIn, **ident: str) -> None:
        for kind, value in ident.items():
            check_id(kind, value)
        check_labels(name=body.name)
        check_metadata(body.metadata, cfg.max_metadata_bytes)

    @app.post("/harnessrl/rollouts", dependencies=[api])
    async def create_rollout(body: CreateRollout, request: Request):
        if body.id is not None:
            check_id("rollout", body.id, "id")
        check_labels(task_id=body.task_id, group_id=body.group_id, run=body.run)
        check_metadata(body.metadata, cfg.max_metadata_bytes)
        r = await run_in_threadpool(store.create, body.task_id, body.group_id, body.run, body.metadata, body.id)
        statuses.set(r.id, r.status)  # on the event loop thread, like every use of the cache
        base = str(request.base_url).rstrip("/")
        return _json({**rollout_json(r), "base_url_template": f"{base}/r/{r.id}/a/{{agent}}/v1"})

    @app.post("/harnessrl/rollouts/{rollout_id}/reward", dependencies=[api])
    def outcome_reward(rollout_id: str, body: RewardIn):
        _reward_ok(body, rollout=rollout_id)
        rid = store.outcome(rollout_id, body.value, body.name or "outcome", body.metadata)
        return _json({"id": rid, "rollout_id": rollout_id, "kind": "outcome", "value": body.value})

    @app.post("/harnessrl/calls/{call_id}/reward", dependencies=[api])
    def process_reward(call_id: str, body: RewardIn):
        _reward_ok(body, call=call_id)
        rid = store.process(call_id, body.value, body.name or "process", body.metadata)
        return _json({"id": rid, "call_id": call_id, "kind": "process", "value": body.value})

    @app.post("/harnessrl/rollouts/{rollout_id}/finish", dependencies=[api])
    async def finish_rollout(rollout_id: str, body: FinishIn | None = None):
        check_id("rollout", rollout_id)
        r = await run_in_threadpool(store.finish, rollout_id, body.error if body else None)
        statuses.set(r.id, r.status)
        running.serving.index.forget(r.id)  # here, on the event loop thread that owns the index
        return _json(rollout_json(r))

    @app.get("/harnessrl/rollouts", dependencies=[api])
    def list_rollouts(task_id: str | None = None, group_id: str | None = None, run: str | None = None):
        check_labels(task_id=task_id, group_id=group_id, run=run)
        return _json({"object": "list", "data": store.list(task_id, group_id, run)})

    @app.get("/harnessrl/rollouts/{rollout_id}", dependencies=[api])
    def get_rollout(rollout_id: str):
        check_id("rollout", rollout_id)
        return _json(store.get(rollout_id))
