"""The rollout list and group queries: filters and sorts on indexed columns only, paging in the
database, and per-call aggregates computed for the rows of one page (never for the whole table),
so a page costs the same with 100 or 100k rollouts. A row names the harnesses (the calls'
User-Agent), models and API surfaces of its calls and counts its harness-visible errors
(`rollouts.errors`, kept by the proxy, so filtering and sorting on it reads no calls).

A rollout's outcome reward is its latest reported `outcome` reward (the compiler's rule: the
latest report wins); the reward-range filter keeps rollouts with an outcome report in range.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import Engine, and_, func, literal, or_, select

from harnessrl.errors import UserError
from harnessrl.records import Call, Reward, Rollout

PER_PAGE_MAX = 200
STATUSES = ("running", "finished", "failed")


def _outcome_kind():
    # `kind || ''`: keeps SQLite's planner off ix_rewards_kind_value (every outcome row) for
    # lookups of one rollout's rewards, which ix_rewards_rollout_id answers in a few rows
    return Reward.kind.op("||")("") == "outcome"


def _latest_outcome():
    """Correlated subquery: the latest outcome reward of the outer rollout."""
    return (select(Reward.value).where(Reward.rollout_id == Rollout.id, _outcome_kind())
            .order_by(Reward.id.desc()).limit(1).scalar_subquery())


SORTS = {
    "started": Rollout.created_at,
    "id": Rollout.id,
    "task": Rollout.task_id,
    "group": Rollout.group_id,
    "run": Rollout.run,
    "status": Rollout.status,
    "errors": Rollout.errors,
    "reward": None,  # the latest outcome, bound per query
}
ERRORS = ("yes", "no")  # the errors filter: rollouts with / without harness-visible errors
SHOWN = 2  # distinct harnesses, models, surfaces named per row (the rest counted)


@dataclass(frozen=True)
class ListQuery:
    """The list page's filters, sort and page (also the JSON endpoint's query parameters)."""

    run: str = ""
    task: str = ""
    group: str = ""
    status: str = ""
    errors: str = ""
    reward_min: float | None = None
    reward_max: float | None = None
    sort: str = "started"
    order: str = "desc"
    page: int = 1
    per_page: int = 50

    @classmethod
    def parse(cls, params: dict[str, str]) -> ListQuery:
        """From URL query parameters; bad values are a one-line UserError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known - {"live"})
        if unknown:
            raise UserError(f"unknown query parameter {unknown[0]!r} (known: {', '.join(sorted(known))})")
        values: dict[str, Any] = {k: params[k].strip() for k in ("run", "task", "group", "status", "errors")
                                  if k in params}
        if any("\x00" in v for v in values.values()):  # no label holds it (PostgreSQL cannot even compare it)
            raise UserError("a filter may not hold U+0000")
        for k in ("reward_min", "reward_max"):
            if params.get(k, "").strip():
                try:
                    values[k] = float(params[k])
                except ValueError:
                    raise UserError(f"{k}={params[k]!r} is not a number") from None
        for k in ("page", "per_page"):
            if params.get(k, "").strip():
                try:
                    values[k] = int(params[k])
                except ValueError:
                    raise UserError(f"{k}={params[k]!r} is not an integer") from None
        q = cls(sort=params.get("sort") or "started", order=params.get("order") or "desc", **values)
        if q.sort not in SORTS:
            raise UserError(f"sort={q.sort!r}: use one of {', '.join(SORTS)}")
        if q.order not in ("asc", "desc"):
            raise UserError(f"order={q.order!r}: use asc or desc")
        if q.status and q.status not in STATUSES:
            raise UserError(f"status={q.status!r}: use one of {', '.join(STATUSES)}")
        if q.errors and q.errors not in ERRORS:
            raise UserError(f"errors={q.errors!r}: use yes or no")
        if q.page < 1 or not 1 <= q.per_page <= PER_PAGE_MAX:
            raise UserError(f"page must be ≥ 1 and per_page within 1..{PER_PAGE_MAX}")
        return q

    def params(self, **change: Any) -> dict[str, str]:
        """The non-default parameters (for links), with `change` applied."""
        out = {}
        for f in fields(self):
            v = change.get(f.name, getattr(self, f.name))
            if v not in (None, "") and v != f.default:
                out[f.name] = str(v)
        return out


def _filtered(q: ListQuery, stmt):
    for value, col in ((q.run, Rollout.run), (q.task, Rollout.task_id), (q.group, Rollout.group_id),
                       (q.status, Rollout.status)):
        if value:
            stmt = stmt.where(col == value)
    if q.errors:
        stmt = stmt.where(Rollout.errors > 0 if q.errors == "yes" else Rollout.errors == 0)
    if q.reward_min is not None or q.reward_max is not None:
        cond = [Reward.kind == "outcome"]
        if q.reward_min is not None:
            cond.append(Reward.value >= q.reward_min)
        if q.reward_max is not None:
            cond.append(Reward.value <= q.reward_max)
        stmt = stmt.where(Rollout.id.in_(select(Reward.rollout_id).where(*cond)))
    return stmt


def list_rollouts(engine: Engine, q: ListQuery) -> dict[str, Any]:
    """One page of rollouts: {total, page, pages, rows}; each row with its outcome reward and
    its calls / sessions / agents / generated tokens."""
    key = _latest_outcome() if q.sort == "reward" else SORTS[q.sort]
    first = key.desc() if q.order == "desc" else key.asc()
    if q.sort == "reward":
        first = first.nulls_last()  # rollouts without an outcome last either way, on every DB
    order = [first, Rollout.id.desc() if q.order == "desc" else Rollout.id]
    with engine.connect() as conn:
        total = conn.execute(_filtered(q, select(func.count()).select_from(Rollout))).scalar_one()
        rows = conn.execute(_filtered(q, select(Rollout.id, Rollout.task_id, Rollout.group_id, Rollout.run,
                                                Rollout.status, Rollout.errors, Rollout.created_at,
                                                Rollout.finished_at))
                            .order_by(*order).limit(q.per_page).offset((q.page - 1) * q.per_page)).all()
        out = [_row(r) for r in rows]
        _add_aggregates(conn, out)
    return {"total": total, "page": q.page, "per_page": q.per_page,
            "pages": max(1, -(-total // q.per_page)), "rows": out}


def _row(r) -> dict[str, Any]:
    return {"id": r.id, "task": r.task_id, "group": r.group_id, "run": r.run, "status": r.status,
            "errors": r.errors, "started": r.created_at,
            "duration": (r.finished_at - r.created_at) if r.finished_at else None,
            "reward": None, "calls": 0, "sessions": 0, "agents": 0, "tokens": 0,
            "harness": [], "model": [], "surface": [], "more": {"harness": 0, "model": 0, "surface": 0}}


def _add_aggregates(conn, rows: list[dict[str, Any]]) -> None:
    """Outcome rewards and call counts of these rows only (rewards.rollout_id and the calls'
    (rollout_id, seq) index)."""
    by_id = {r["id"]: r for r in rows}
    if not by_id:
        return
    ids = list(by_id)
    session = func.coalesce(literal("s:") + Call.session_id, literal("a:") + func.coalesce(Call.agent, "default"))
    agg = (select(Call.rollout_id, func.count(), func.count(func.distinct(session)),
                  func.count(func.distinct(Call.agent)), func.coalesce(func.sum(Call.completion_tokens), 0))
           .where(Call.rollout_id.in_(ids)).group_by(Call.rollout_id))
    for rid, n, sessions, agents, tokens in conn.execute(agg):
        by_id[rid].update(calls=n, sessions=sessions, agents=agents, tokens=int(tokens))
    _add_kinds(conn, by_id)
    rewards = (select(Reward.rollout_id, Reward.value).where(Reward.rollout_id.in_(ids), _outcome_kind())
               .order_by(Reward.id))
    for rid, value in conn.execute(rewards):
        by_id[rid]["reward"] = value  # the latest report wins


def _add_kinds(conn, by_id: dict[str, dict[str, Any]]) -> None:
    """Per row the harnesses (User-Agent), models and API surfaces of its calls, the most used
    first: SHOWN of each named, the rest counted in `more`."""
    surface = func.coalesce(Call.surface, Call.endpoint)  # calls recorded before the column: their endpoint
    kinds = (select(Call.rollout_id, Call.client, Call.model, surface, func.count())
             .where(Call.rollout_id.in_(list(by_id))).group_by(Call.rollout_id, Call.client, Call.model, surface))
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for rid, client, model, surface, n in conn.execute(kinds):
        per = counts.setdefault(rid, {"harness": {}, "model": {}, "surface": {}})
        for name, value in (("harness", client), ("model", model), ("surface", surface)):
            if value:
                per[name][value] = per[name].get(value, 0) + n
    for rid, per in counts.items():
        for name, seen in per.items():
            ranked = sorted(seen, key=lambda v: (-seen[v], v))
            by_id[rid][name] = ranked[:SHOWN]
            by_id[rid]["more"][name] = len(ranked) - SHOWN if len(ranked) > SHOWN else 0


def runs(engine: Engine, limit: int = 200) -> list[str]:
    """Distinct run tags for the filter menu (an index scan on ix_rollouts_run)."""
    with engine.connect() as conn:
        return [r for (r,) in conn.execute(select(Rollout.run).where(Rollout.run.is_not(None)).distinct()
                                           .order_by(Rollout.run).limit(limit))]


GROUP_LIMIT = 500


def group_rollouts(engine: Engine, group: str) -> list[dict[str, Any]]:
    """The rollouts of a group, as the compiler groups them: the group id, else the task id."""
    cond = or_(Rollout.group_id == group, and_(Rollout.group_id.is_(None), Rollout.task_id == group))
    with engine.connect() as conn:
        rows = conn.execute(select(Rollout.id, Rollout.task_id, Rollout.group_id, Rollout.run, Rollout.status,
                                   Rollout.errors, Rollout.created_at, Rollout.finished_at)
                            .where(cond).order_by(Rollout.created_at, Rollout.id).limit(GROUP_LIMIT)).all()
        out = [_row(r) for r in rows]
        _add_aggregates(conn, out)
    return out
