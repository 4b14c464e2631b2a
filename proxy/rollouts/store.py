"""The rollout API's DB side (low rate: plain ORM sessions, run in a worker thread)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from sqlalchemy import and_, insert, literal, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from harnessrl.proxy.errors import ProxyError
from harnessrl.records import UNASSIGNED_ROLLOUT, Call, Reward, Rollout, WeightVersion

# the metadata of a rollout created on first use (a call naming an unknown id), which nobody finishes
FIRST_USE = {"created_by": "first_use"}
# a rollout takes rewards while it runs, and after the proxy finished it for being idle (its
# outcome is often known only later: `harnessrl reward`); never after its owner finished it
TAKES_REWARDS = or_(Rollout.status == "running", and_(Rollout.status == "finished",
                                                      Rollout.meta["finished_by"].as_string() == "idle"))

# a rollout's calls as the API lists them: every column but the bulky ones (bodies, token arrays)
_CALL_FIELDS = tuple(c.name for c in Call.__table__.columns if c.name not in {
    "rollout_id", "request", "response", "prompt_ids", "completion_ids", "completion_logprobs"})


def _not_found(what: str, ident: str) -> ProxyError:
    return ProxyError(404, f"{what} {ident!r} does not exist", "invalid_request_error", code=f"{what}_not_found")


def readable(meta: Any) -> Any:
    """Stored metadata as the answer can hold it. A DB written before `limits.check_metadata`
    refused such values may hold an integer beyond 64 bits or nesting deeper than orjson writes:
    that one value is replaced by a note, so the list and the rollout still answer."""
    if meta is None:
        return None
    try:
        orjson.dumps(meta)
    except orjson.JSONEncodeError:
        return {"harnessrl_unreadable": "this metadata cannot be written as JSON by the proxy (an integer beyond "
                                        "64 bits or nesting deeper than 254 levels); it is kept in the records DB"}
    return meta


def rollout_json(r: Rollout) -> dict[str, Any]:
    return {"id": r.id, "task_id": r.task_id, "group_id": r.group_id, "run": r.run, "metadata": readable(r.meta),
            "status": r.status, "created_at": r.created_at, "finished_at": r.finished_at,
            "errors": r.errors or 0}  # calls answered with an error (refused or failed) while it ran


class Rollouts:
    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self.Session = session_factory

    def create(self, task_id: str | None, group_id: str | None, run: str | None, metadata: dict | None,
               rollout_id: str | None = None) -> Rollout:
        """A new running rollout; `rollout_id` chosen by the client (409 if it is taken)."""
        r = Rollout(id=rollout_id or uuid.uuid4().hex, task_id=task_id, group_id=group_id, run=run, meta=metadata,
                    status="running", next_seq=0, created_at=time.time())
        try:
            with self.Session.begin() as s:
                s.add(r)
        except IntegrityError:
            raise ProxyError(409, f"rollout {r.id!r} already exists", code="rollout_exists") from None
        return r

    def status(self, rollout_id: str, create: bool = False) -> str | None:
        """The rollout's status; with `create`, a missing rollout is created first (running, no task)."""
        with self.Session() as s:
            status = s.scalar(select(Rollout.status).where(Rollout.id == rollout_id))
        if status is not None or not create:
            return status
        try:  # marked: nobody finishes such a rollout, so it is finished when idle (`idle.py`)
            with self.Session.begin() as s:
                s.add(Rollout(id=rollout_id, status="running", next_seq=0, created_at=time.time(), meta=FIRST_USE))
        except IntegrityError:  # created meanwhile by another request or proxy
            return self.status(rollout_id)
        return "running"

    def outcome_by(self, rollout_id: str) -> str | None:
        """Who reports the rollout's outcome (`metadata.outcome_by`, set at its creation): "scorer"
        refuses the rollout's own key an outcome (`api`)."""
        with self.Session() as s:
            meta = s.scalar(select(Rollout.meta).where(Rollout.id == rollout_id))
        value = meta.get("outcome_by") if isinstance(meta, dict) else None
        return value if isinstance(value, str) else None

    def rollout_of(self, call_id: str) -> str:
        """The rollout of call `call_id` (404 if there is no such call)."""
        with self.Session() as s:
            rollout_id = s.scalar(select(Call.rollout_id).where(Call.id == call_id))
        if rollout_id is None:
            raise _not_found("call", call_id)
        return rollout_id

    def outcome(self, rollout_id: str, value: float, name: str, meta: dict | None) -> int:
        return self._reward(rollout_id, None, "outcome", name, value, meta)

    def process(self, call_id: str, value: float, name: str, meta: dict | None) -> int:
        return self._reward(self.rollout_of(call_id), call_id, "process", name, value, meta)

    def _reward(self, rollout_id: str, call_id: str | None, kind: str, name: str, value: float,
                meta: dict | None) -> int:
        # inserted only while the rollout runs, checked in the insert itself: a finish that
        # commits first (through any proxy) wins, and the reward is refused
        row = select(literal(rollout_id), literal(call_id), literal(kind), literal(name), literal(value),
                     literal(meta, Reward.meta.type), literal(time.time())).where(
            Rollout.id == rollout_id, TAKES_REWARDS)
        cols = ["rollout_id", "call_id", "kind", "name", "value", "meta", "created_at"]
        with self.Session.begin() as s:
            rid = s.scalar(insert(Reward).from_select(cols, row).returning(Reward.id))
            if rid is not None:
                return rid
            if s.get(Rollout, rollout_id) is None:
                raise _not_found("rollout", rollout_id)
            raise ProxyError(409, f"rollout {rollout_id!r} is finished: rewards are taken while it runs (or after "
                                  "the proxy finished it for being idle)", code="rollout_finished")

    def finish_idle(self, idle_s: float, now: float) -> list[str]:
        """Finish the rollouts created on first use that had no call or reward for `idle_s`
        seconds (`finished_by: idle`); their ids. Each is checked again in the transaction that
        finishes it, its row locked, so a call committed meanwhile keeps it running."""
        cutoff = now - idle_s
        with self.Session() as s:
            ids = list(s.scalars(select(Rollout.id).where(
                Rollout.status == "running", Rollout.created_at < cutoff, Rollout.id != UNASSIGNED_ROLLOUT,
                Rollout.meta["created_by"].as_string() == FIRST_USE["created_by"])))
        done = []
        for rid in ids:
            with self.Session.begin() as s:
                r = s.get(Rollout, rid, with_for_update=True)
                if r is None or r.status != "running" or any(
                        s.scalar(select(t.id).where(t.rollout_id == rid, t.created_at >= cutoff).limit(1)) is not None
                        for t in (Call, Reward)):
                    continue
                r.meta = {**(r.meta or {}), "finished_by": "idle"}
                r.status, r.finished_at = "finished", now
                done.append(rid)
        return done

    def finish(self, rollout_id: str, error: str | None = None) -> Rollout:
        """Finish a running rollout; with `error`, mark it `failed` (also one that had finished:
        whoever runs the rollouts decided it does not count, e.g. a retried attempt), the reason
        kept in its metadata."""
        with self.Session.begin() as s:
            r = s.get(Rollout, rollout_id)
            if r is None:
                raise _not_found("rollout", rollout_id)
            if error is not None and r.status != "failed":
                r.meta = {**(r.meta or {}), "error": error[:1000]}
                r.status, r.finished_at = "failed", r.finished_at or time.time()
            elif r.status == "running":
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
                               "metadata": readable(w.meta)} for w in rewards]
            return out

    def weight_version(self, version: str, path: str | None) -> None:
        with self.Session.begin() as s:
            if s.scalar(select(WeightVersion.id).where(WeightVersion.version == version)) is None:
                s.add(WeightVersion(version=version, path=path, created_at=time.time()))
