"""The rollout API's DB side (low rate: plain ORM sessions, run in a worker thread)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from harnessrl.proxy.errors import ProxyError
from harnessrl.records import Call, Reward, Rollout, WeightVersion

# a rollout's calls as the API lists them: every column but the bulky ones (bodies, token arrays)
_CALL_FIELDS = tuple(c.name for c in Call.__table__.columns if c.name not in {
    "rollout_id", "request", "response", "prompt_ids", "completion_ids", "completion_logprobs"})


def _not_found(what: str, ident: str) -> ProxyError:
    return ProxyError(404, f"{what} {ident!r} does not exist", "invalid_request_error", code=f"{what}_not_found")


def rollout_json(r: Rollout) -> dict[str, Any]:
    return {"id": r.id, "task_id": r.task_id, "group_id": r.group_id, "run": r.run, "metadata": r.meta,
            "status": r.status, "created_at": r.created_at, "finished_at": r.finished_at}


class Rollouts:
    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self.Session = session_factory

    def create(self, task_id: str | None, group_id: str | None, run: str | None, metadata: dict | None) -> Rollout:
        r = Rollout(id=uuid.uuid4().hex, task_id=task_id, group_id=group_id, run=run, meta=metadata,
                    status="running", next_seq=0, created_at=time.time())
        with self.Session.begin() as s:
            s.add(r)
        return r

    def status(self, rollout_id: str) -> str | None:
        with self.Session() as s:
            return s.scalar(select(Rollout.status).where(Rollout.id == rollout_id))

    def outcome(self, rollout_id: str, value: float, name: str, meta: dict | None) -> int:
        with self.Session.begin() as s:
            if s.get(Rollout, rollout_id) is None:
                raise _not_found("rollout", rollout_id)
            rw = Reward(rollout_id=rollout_id, call_id=None, kind="outcome", name=name, value=value, meta=meta,
                        created_at=time.time())
            s.add(rw)
            s.flush()
            return rw.id

    def process(self, call_id: str, value: float, name: str, meta: dict | None) -> int:
        with self.Session.begin() as s:
            rollout_id = s.scalar(select(Call.rollout_id).where(Call.id == call_id))
            if rollout_id is None:
                raise _not_found("call", call_id)
            rw = Reward(rollout_id=rollout_id, call_id=call_id, kind="process", name=name, value=value, meta=meta,
                        created_at=time.time())
            s.add(rw)
            s.flush()
            return rw.id

    def finish(self, rollout_id: str) -> Rollout:
        with self.Session.begin() as s:
            r = s.get(Rollout, rollout_id)
            if r is None:
                raise _not_found("rollout", rollout_id)
            if r.status != "finished":
                r.status, r.finished_at = "finished", time.time()
            return r

    def list(self, task_id: str | None, group_id: str | None, run: str | None) -> list[dict]:
        q = select(Rollout).order_by(Rollout.created_at)
        for col, v in ((Rollout.task_id, task_id), (Rollout.group_id, group_id), (Rollout.run, run)):
            if v is not None:
                q = q.where(col == v)
        with self.Session() as s:
            return [rollout_json(r) for r in s.scalars(q)]

    def get(self, rollout_id: str) -> dict:
        with self.Session() as s:
            r = s.get(Rollout, rollout_id)
            if r is None:
                raise _not_found("rollout", rollout_id)
            out = rollout_json(r)
            calls = s.scalars(select(Call).where(Call.rollout_id == rollout_id).order_by(Call.seq))
            out["calls"] = [{f: getattr(c, f) for f in _CALL_FIELDS} for c in calls]
            rewards = s.scalars(select(Reward).where(Reward.rollout_id == rollout_id).order_by(Reward.id))
            out["rewards"] = [{"id": w.id, "call_id": w.call_id, "kind": w.kind, "name": w.name, "value": w.value,
                               "metadata": w.meta} for w in rewards]
            return out

    def weight_version(self, version: str, path: str | None) -> None:
        with self.Session.begin() as s:
            if s.scalar(select(WeightVersion.id).where(WeightVersion.version == version)) is None:
                s.add(WeightVersion(version=version, path=path, created_at=time.time()))
