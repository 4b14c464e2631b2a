"""The rollout API (`/harnessrl/rollouts...`, `/harnessrl/calls/{id}/reward`): create, list, read
and finish rollouts, and take outcome and process rewards (`harnessrl.client` speaks it). FastAPI
routes with pydantic bodies (`bodies`), behind the proxy's key.

Creating and listing rollouts is the operator's (`key_required`). A rollout's own key (minted in
the answer to its creation, `api_key_template`) may read its own rollout and, unless the rollout's
outcome is its scorer's (`outcome_by: scorer`), post its own outcome, its own calls' process
rewards and finish it plainly; never another rollout's, never finish as failed (that is the
owner's word on a crash or timeout, and a failed rollout escapes its group's statistics).
"""

from __future__ import annotations

import orjson
from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from harnessrl.proxy.config import ProxyConfig
from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.identity import (check_id, check_labels, check_scope, key_required, key_scope, rollout_base_path,
                                     rollout_key)
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
    operator = key_required(cfg.api_key)
    caller = key_scope(cfg.api_key)

    def _reward_ok(body: RewardIn, **ident: str) -> None:
        for kind, value in ident.items():
            check_id(kind, value)
        check_labels(name=body.name)
        check_metadata(body.metadata, cfg.max_metadata_bytes)

    def _harness_may(scope: str | None, rollout_id: str, what: str) -> None:
        """403 unless the caller may post `what` for `rollout_id` (a DB read: a low-rate route)."""
        if scope is None:
            return
        check_scope(scope, rollout_id)
        if store.outcome_by(rollout_id) == "scorer":
            raise ProxyError(403, f"rollout {rollout_id!r} is scored by its scorer (outcome_by: scorer): its own "
                                  f"key cannot post its {what}; only the operator's key can", "permission_error",
                             code="outcome_by_scorer")

    @app.post("/harnessrl/rollouts", dependencies=[operator])
    async def create_rollout(body: CreateRollout, request: Request):
        if body.id is not None:
            check_id("rollout", body.id, "id")
        check_labels(task_id=body.task_id, group_id=body.group_id, run=body.run)
        meta = body.metadata if body.outcome_by is None else {**(body.metadata or {}), "outcome_by": body.outcome_by}
        check_metadata(meta, cfg.max_metadata_bytes)
        r = await run_in_threadpool(store.create, body.task_id, body.group_id, body.run, meta, body.id)
        statuses.set(r.id, r.status)  # on the event loop thread, like every use of the cache
        base = str(request.base_url).rstrip("/")
        return _json({**rollout_json(r), "base_url_template": base + rollout_base_path(cfg.api_key, r.id),
                      "api_key_template": rollout_key(cfg.api_key, r.id, "{agent}")})

    @app.post("/harnessrl/rollouts/{rollout_id}/reward")
    def outcome_reward(rollout_id: str, body: RewardIn, scope: str | None = caller):
        _reward_ok(body, rollout=rollout_id)
        _harness_may(scope, rollout_id, "outcome reward")
        rid = store.outcome(rollout_id, body.value, body.name or "outcome", body.metadata)
        return _json({"id": rid, "rollout_id": rollout_id, "kind": "outcome", "value": body.value})

    @app.post("/harnessrl/calls/{call_id}/reward")
    def process_reward(call_id: str, body: RewardIn, scope: str | None = caller):
        _reward_ok(body, call=call_id)
        if scope is not None:
            _harness_may(scope, store.rollout_of(call_id), "process rewards")
        rid = store.process(call_id, body.value, body.name or "process", body.metadata)
        return _json({"id": rid, "call_id": call_id, "kind": "process", "value": body.value})

    @app.post("/harnessrl/rollouts/{rollout_id}/finish")
    async def finish_rollout(rollout_id: str, body: FinishIn | None = None, scope: str | None = caller):
        check_id("rollout", rollout_id)
        if scope is not None and body is not None and body.error is not None:
            raise ProxyError(403, "finishing a rollout as failed needs the operator's key: a rollout's own key "
                                  "may only finish it", "permission_error", code="operator_key_required")
        await run_in_threadpool(_harness_may, scope, rollout_id, "finish")
        r = await run_in_threadpool(store.finish, rollout_id, body.error if body else None)
        statuses.set(r.id, r.status)
        running.serving.index.forget(r.id)  # here, on the event loop thread that owns the index
        return _json(rollout_json(r))

    @app.get("/harnessrl/rollouts", dependencies=[operator])
    def list_rollouts(task_id: str | None = None, group_id: str | None = None, run: str | None = None):
        check_labels(task_id=task_id, group_id=group_id, run=run)
        return _json({"object": "list", "data": store.list(task_id, group_id, run)})

    @app.get("/harnessrl/rollouts/{rollout_id}")
    def get_rollout(rollout_id: str, scope: str | None = caller):
        check_id("rollout", rollout_id)
        check_scope(scope, rollout_id)
        return _json(store.get(rollout_id))
