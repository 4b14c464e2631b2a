"""`harnessrl traces from-rollouts`: the best recorded rollouts of each task as expert traces.

A teacher (a hosted model, a large vLLM) runs the same harness through the proxy; its rollouts
are recorded like any other. For each task, the rollouts with the highest outcome reward (the
latest report wins, as in compile) give the trace: the agent's last successful chat call holds
the whole conversation the agent saw (its request messages) and its last answer (the response
message). The messages before the first assistant turn become the task `input` (so the harness's
own system prompt travels with the trace), the rest the `expert_trace`, the request's `tools` the
tool schemas — the tasks-file format `sft` and PACT read.

Any upstream works, token ids or not: only the messages are read. Provenance (rollout, agent,
model, reward, call) is kept; identical traces of a task are written once.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from harnessrl.db import db_url, open_db
from harnessrl.errors import UserError
from harnessrl.records import Call, ExpertTrace, Reward, Rollout, Task

SOURCE_PREFIX = "rollout:"  # ExpertTrace.source of a trace taken from a rollout
_MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")


@dataclass
class TraceStats:
    rollouts: int = 0  # rollouts with a task read
    no_outcome: int = 0  # skipped: no outcome reward reported
    below_min: int = 0  # skipped: outcome below --min-reward
    no_answer: int = 0  # skipped: the agent has no successful chat call
    duplicates: int = 0  # skipped: the same trace as a better one of the task
    traces: int = 0

    def line(self) -> str:
        return (f"{self.traces} traces from {self.rollouts} rollouts (skipped: {self.no_outcome} without an outcome, "
                f"{self.below_min} below --min-reward, {self.no_answer} without an answer, "
                f"{self.duplicates} duplicates)")


@dataclass
class Trace:
    task_id: str
    input: list[dict[str, Any]]
    expert_trace: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    reference: Any = None
    provenance: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """One line of the tasks file."""
        out: dict[str, Any] = {"id": self.task_id, "input": self.input, "expert_trace": self.expert_trace}
        if self.reference is not None:
            out["reference"] = self.reference
        if self.tools:
            out["tools"] = self.tools
        out["provenance"] = self.provenance
        return out


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    return {k: message[k] for k in _MESSAGE_KEYS if message.get(k) is not None}


def _answer_message(call: Any) -> dict[str, Any] | None:
    """The assistant message the harness got from a recorded chat call."""
    choices = (call.response or {}).get("choices") if isinstance(call.response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict):
            return _clean({**message, "role": "assistant"})
    if call.response_text is None and not call.tool_calls:
        return None
    return _clean({"role": "assistant", "content": call.response_text, "tool_calls": call.tool_calls})


def split_conversation(messages: list[dict[str, Any]]) -> tuple[list[dict], list[dict]] | None:
    """(input, expert turns): everything before the first assistant message, and the rest."""
    cleaned = [_clean(m) for m in messages if isinstance(m, dict) and isinstance(m.get("role"), str)]
    first = next((i for i, m in enumerate(cleaned) if m["role"] == "assistant"), None)
    if first is None or first == 0:
        return None
    return cleaned[:first], cleaned[first:]


def _trace_of(call: Any) -> tuple[list[dict], list[dict], list[dict] | None] | None:
    answer = _answer_message(call)
    request = call.request if isinstance(call.request, dict) else {}
    messages = request.get("messages")
    if answer is None or not isinstance(messages, list):
        return None
    parts = split_conversation([*messages, answer])
    if parts is None:
        return None
    tools = request.get("tools") if isinstance(request.get("tools"), list) else None
    return parts[0], parts[1], tools


def _dedupe_key(messages: list[dict[str, Any]]) -> str:
    """Traces differing only in tool-call ids (random per call) are the same trace."""
    ids: dict[str, str] = {}

    def norm(value: Any) -> Any:
        return ids.setdefault(value, f"call_{len(ids)}") if isinstance(value, str) else value

    canonical = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "id": norm(c.get("id"))} if isinstance(c, dict) else c for c in m["tool_calls"]]
        if "tool_call_id" in m:
            m["tool_call_id"] = norm(m["tool_call_id"])
        canonical.append(m)
    return json.dumps(canonical, sort_keys=True)


def _open(db: str):
    url = db_url(db)
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        raise UserError(f"records DB not found: {db}")
    return open_db(db)


def _outcomes(s: Any, rollout_ids: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for i in range(0, len(rollout_ids), 500):
        q = (select(Reward.rollout_id, Reward.value).where(Reward.rollout_id.in_(rollout_ids[i:i + 500]),
                                                           Reward.kind == "outcome").order_by(Reward.id))
        for rid, value in s.execute(q):
            out[rid] = value  # the latest report wins
    return out


def _last_answer(s: Any, rollout_id: str, agent: str | None) -> Any:
    """The agent's last successful chat call in the rollout (default agent: the first call's)."""
    q = select(Call).where(Call.rollout_id == rollout_id, Call.endpoint == "chat", Call.status == "ok")
    calls = s.execute(q.order_by(Call.seq)).scalars().all()
    if not calls:
        return None
    wanted = agent if agent is not None else calls[0].agent
    mine = [c for c in calls if c.agent == wanted]
    return mine[-1] if mine else None


def collect(db: str, run: str | None = None, min_reward: float | None = None, agent: str | None = None,
            per_task: int = 1) -> tuple[list[Trace], TraceStats]:
    """The best `per_task` distinct traces of each task (highest outcome, then earliest)."""
    if per_task < 1:
        raise UserError("--per-task must be at least 1")
    _, make_session = _open(db)
    stats = TraceStats()
    traces: list[Trace] = []
    with make_session() as s:
        q = select(Rollout.id, Rollout.task_id, Rollout.created_at).where(Rollout.task_id.is_not(None))
        if run is not None:
            q = q.where(Rollout.run == run)
        rollouts = s.execute(q).all()
        stats.rollouts = len(rollouts)
        outcomes = _outcomes(s, [r.id for r in rollouts])
        by_task: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
        for r in rollouts:
            if r.id not in outcomes:
                stats.no_outcome += 1
            elif min_reward is not None and outcomes[r.id] < min_reward:
                stats.below_min += 1
            else:
                by_task[r.task_id].append((-outcomes[r.id], r.created_at, r.id))
        references = _references(s, list(by_task))
        for task_id in sorted(by_task):
            seen: set[str] = set()
            for neg_reward, _, rid in sorted(by_task[task_id]):
                if len(seen) == per_task:
                    break
                call = _last_answer(s, rid, agent)
                parts = _trace_of(call) if call is not None else None
                if parts is None:
                    stats.no_answer += 1
                    continue
                key = _dedupe_key(parts[0] + parts[1])
                if key in seen:
                    stats.duplicates += 1
                    continue
                seen.add(key)
                provenance = {"rollout_id": rid, "agent": call.agent, "model": call.model, "reward": -neg_reward,
                              "call_id": call.id, "weight_version": call.weight_version}
                traces.append(Trace(task_id, parts[0], parts[1], parts[2], references.get(task_id), provenance))
    stats.traces = len(traces)
    return traces, stats


def _references(s: Any, task_ids: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in range(0, len(task_ids), 500):
        for tid, ref in s.execute(select(Task.id, Task.reference).where(Task.id.in_(task_ids[i:i + 500]))):
            out[tid] = ref
    return out


def write_jsonl(traces: Iterable[Trace], out: Path) -> None:
    rows = [t.row() for t in traces]
    ids = [r["id"] for r in rows]
    if len(ids) != len(set(ids)):
        raise UserError("a tasks file holds one trace per task: use --per-task 1 with --out (or write to the DB)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    tmp.replace(out)


def write_db(db: str, traces: list[Trace]) -> int:
    """Add the traces to the DB's expert-trace table (a task row is made where missing); a trace
    already taken from the same rollout is not added twice. Returns the number added."""
    _, make_session = _open(db)
    now, added = time.time(), 0
    with make_session.begin() as s:
        for t in traces:
            if s.get(Task, t.task_id) is None:
                s.add(Task(id=t.task_id, input=t.input, reference=t.reference, reference_calls=None, meta=None,
                           created_at=now))
                s.flush()
            source = SOURCE_PREFIX + t.provenance["rollout_id"]
            exists = s.execute(select(ExpertTrace.id).where(ExpertTrace.task_id == t.task_id,
                                                            ExpertTrace.source == source)).first()
            if exists is None:
                s.add(ExpertTrace(task_id=t.task_id, messages=t.expert_trace, source=source, created_at=now))
                added += 1
    return added
