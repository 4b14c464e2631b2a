"""`harnessrl compile`: records DB → `samples.parquet`, `tasks.parquet`, `stats.json`.

Rollouts are read group by group (a batch of whole groups per query, calls in `(rollout, seq)`
index order), so memory is bounded by a batch and every group's advantages can be computed
before its samples are written. Token work is numpy over int32 arrays; the request JSON is
read only when a process reward, a cross-session edge or a re-rendering needs it.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import select

from harnessrl.compiler import advantages as adv
from harnessrl.compiler.classes import ClassConfig, ParsedResponse, TokenText, batch_token_classes, parse_response
from harnessrl.compiler.matchtir import call_rewards, reference_calls, turn_rewards
from harnessrl.compiler.rewards import dispatch_ok, f1, load_reward_fn, observed_results, tool_format
from harnessrl.compiler.schema import CLASS_NAMES, SAMPLE_SCHEMA, TASK_SCHEMA
from harnessrl.compiler.traces import structure_trace
from harnessrl.compiler.trees import CallTokens, SessionTree, build_forest, infer_parent_calls, linear_paths, session_key
from harnessrl.db import db_url, open_db
from harnessrl.errors import UserError
from harnessrl.records import Call, ExpertTrace, Reward, Rollout, Task, unpack_ids, unpack_logprobs

PROCESS_REWARDS = ("tool_format", "dispatch_ok", "matchtir")
STAT_KEYS = ("calls", "failed", "retokenized", "sessions", "samples", "merges", "roots_start", "roots_branch",
             "roots_drift", "roots_rewrite", "untrained_sessions", "no_outcome", "tokens_recorded",
             "tokens_emitted", "trainable_tokens", "class_reasoning", "class_action", "class_args", "class_format")


@dataclass
class CompileOptions:
    out: Path = Path("compiled")
    reward: str | None = None  # outcome function name / module:fn; None: the harness-reported outcome
    process: tuple[str, ...] = ()
    advantage: str = "grpo"
    train_agents: str = "central"  # central | all | comma-separated agent names
    rollouts: tuple[str, ...] = ()
    since: str | None = None  # epoch seconds or ISO date-time
    run: str | None = None
    tokenizer: str | None = None  # directory; default: the recorded model, when it is a local directory
    matcher: str = "hungarian"
    central_agent: str | None = None  # default: the agent of each rollout's first call
    adv_config: adv.AdvantageConfig = field(default_factory=adv.AdvantageConfig)
    class_config: ClassConfig = field(default_factory=ClassConfig)
    batch_rollouts: int = 256
    flush_tokens: int = 4_000_000  # write a row group once this many tokens are pending


def validate(opts: CompileOptions) -> None:
    if opts.advantage not in adv.ESTIMATORS:
        raise UserError(f"unknown advantage estimator {opts.advantage!r}: use {', '.join(adv.ESTIMATORS)}")
    for p in opts.process:
        if p not in PROCESS_REWARDS:
            raise UserError(f"unknown process reward {p!r}: use {', '.join(PROCESS_REWARDS)}")
    if opts.matcher not in ("hungarian", "greedy"):
        raise UserError(f"unknown matcher {opts.matcher!r}: use hungarian or greedy")
    if opts.reward is not None:
        load_reward_fn(opts.reward)
    if opts.since is not None:
        parse_since(opts.since)


def parse_since(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise UserError(f"--since {value!r}: expected epoch seconds or an ISO date-time") from None


# ---- per-rollout compilation -----------------------------------------------------------------

@dataclass
class Unit:
    """One decision unit: a compiled call and what was derived from it."""

    call: CallTokens
    tree: SessionTree
    node: int
    classes: np.ndarray
    response_text: str
    native_calls: list[dict[str, Any]] | None
    parsed: ParsedResponse | None = None
    process: dict[str, float] = field(default_factory=dict)
    advantage: float = 0.0

    def parse(self) -> ParsedResponse:
        if self.parsed is None:
            self.parsed = parse_response(self.response_text, self.native_calls)
        return self.parsed


@dataclass
class RolloutWork:
    id: str
    task_id: str | None
    group_id: str
    trees: list[SessionTree] = field(default_factory=list)
    units: dict[str, Unit] = field(default_factory=dict)
    central: str | None = None
    outcome: float = 0.0
    has_outcome: bool = False
    edges: dict[str, str] = field(default_factory=dict)  # session key → parent call id
    stats: Counter = field(default_factory=Counter)


class Compiler:
    def __init__(self, db: str, opts: CompileOptions):
        validate(opts)
        url = db_url(db)
        if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
            raise UserError(f"records DB not found: {db}")
        self.opts = opts
        self.engine, _ = open_db(db)
        self.reward_fn = load_reward_fn(opts.reward) if opts.reward else None
        self._tokenizer: Any = None
        self._tt: TokenText | None = None
        self.totals: Counter = Counter(dict.fromkeys(STAT_KEYS, 0))
        self.per_rollout: dict[str, dict[str, Any]] = {}
        self.tasks: dict[str, dict[str, Any]] = {}
        self.tasks_with_samples: set[str] = set()

    # -- reading --------------------------------------------------------------------------
    def select_rollouts(self) -> list[tuple[str, str | None, str]]:
        o = self.opts
        q = select(Rollout.id, Rollout.task_id, Rollout.group_id)
        if o.rollouts:
            q = q.where(Rollout.id.in_(list(o.rollouts)))
        if o.run:
            q = q.where(Rollout.run == o.run)
        if o.since:
            q = q.where(Rollout.created_at >= parse_since(o.since))
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        # a rollout's group: its group id, else its task (K rollouts of one task), else itself
        out = [(r.id, r.task_id, r.group_id or r.task_id or r.id) for r in rows]
        return sorted(out, key=lambda r: (r[2], r[0]))

    def _load_tasks(self, task_ids: set[str]) -> None:
        ids = sorted(task_ids - set(self.tasks))
        with self.engine.connect() as conn:
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                for t in conn.execute(select(Task.id, Task.input, Task.reference, Task.reference_calls)
                                      .where(Task.id.in_(chunk))):
                    self.tasks[t.id] = {"input": t.input, "reference": t.reference,
                                        "reference_calls": t.reference_calls, "expert_trace": None}
                traces = conn.execute(select(ExpertTrace.task_id, ExpertTrace.messages)
                                      .where(ExpertTrace.task_id.in_(chunk)).order_by(ExpertTrace.id)).all()
                for tr in traces:  # the latest trace of a task wins
                    self.tasks[tr.task_id]["expert_trace"] = tr.messages

    def _requests(self, call_ids: list[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        with self.engine.connect() as conn:
            for i in range(0, len(call_ids), 500):
                for r in conn.execute(select(Call.id, Call.request).where(Call.id.in_(call_ids[i:i + 500]))):
                    out[r.id] = r.request
        return out

    def _tokenizer_dir(self) -> str:
        path = self.opts.tokenizer or self._recorded_model_dir()
        if not path:
            raise UserError("no tokenizer: pass --tokenizer DIR (the recorded model is not a local directory)")
        if not Path(path).is_dir():
            raise UserError(f"tokenizer directory not found: {path}")
        return path

    @property
    def tokenizer(self) -> Any:
        """The transformers tokenizer (its chat template re-renders calls recorded without ids)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            path = self._tokenizer_dir()
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(path)
            except Exception as exc:  # noqa: BLE001 - a user path that holds no tokenizer
                raise UserError(f"cannot load a tokenizer from {path}: {exc}") from None
        return self._tokenizer

    @property
    def token_text(self) -> TokenText:
        if self._tt is None:
            path = self._tokenizer_dir()
            try:
                self._tt = TokenText.from_dir(path)
            except Exception as exc:  # noqa: BLE001 - a user path that holds no tokenizer
                raise UserError(f"cannot load a tokenizer from {path}: {exc}") from None
        return self._tt

    def _recorded_model_dir(self) -> str | None:
        with self.engine.connect() as conn:
            for (model,) in conn.execute(select(Call.model).where(Call.model.is_not(None)).distinct().limit(20)):
                if model and Path(model).is_dir():
                    return model
        return None

    # -- the pipeline ---------------------------------------------------------------------
    def run(self, on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        start = time.perf_counter()
        o = self.opts
        o.out.mkdir(parents=True, exist_ok=True)
        rollouts = self.select_rollouts()
        self._load_tasks({t for _, t, _ in rollouts if t})
        writer = SampleWriter(o.out / "samples.parquet", o.flush_tokens)
        done = 0
        for batch in _group_batches(rollouts, o.batch_rollouts):
            works = self.read_batch(batch)
            self._rewards(works)
            self._advantages(works)
            for w in works:
                self._emit(w, writer)
                done += 1
            if on_progress:
                on_progress(done, len(rollouts))
        writer.close()
        self._write_tasks(o.out / "tasks.parquet")
        t = self.totals
        t["rollouts"] = len(rollouts)
        t["token_saving"] = t["tokens_recorded"] / t["tokens_emitted"] if t["tokens_emitted"] else 0.0
        t["seconds"] = time.perf_counter() - start
        stats = {"totals": dict(t), "rollouts": self.per_rollout,
                 "options": {"reward": o.reward, "process": list(o.process), "advantage": o.advantage,
                             "train_agents": o.train_agents, "matcher": o.matcher}}
        (o.out / "stats.json").write_bytes(orjson.dumps(stats, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        return stats

    def read_batch(self, batch: list[tuple[str, str | None, str]]) -> list[RolloutWork]:
        works = {rid: RolloutWork(rid, task, group) for rid, task, group in batch}
        calls: dict[str, list[CallTokens]] = defaultdict(list)
        extra: dict[str, tuple[str | None, list[Any] | None]] = {}
        missing: list[Any] = []
        cols = (Call.id, Call.rollout_id, Call.seq, Call.session_id, Call.agent, Call.parent_call_id,
                Call.status, Call.prompt_ids, Call.completion_ids, Call.completion_logprobs,
                Call.response_text, Call.tool_calls, Call.weight_version, Call.endpoint)
        q = select(*cols).where(Call.rollout_id.in_(list(works))).order_by(Call.rollout_id, Call.seq)
        with self.engine.connect() as conn:
            for r in conn.execute(q):
                w = works[r.rollout_id]
                w.stats["calls"] += 1
                if r.status != "ok":
                    w.stats["failed"] += 1
                    continue
                if r.prompt_ids is None or r.completion_ids is None:
                    missing.append(r)
                    continue
                calls[r.rollout_id].append(_call_tokens(r, unpack_ids(r.prompt_ids), unpack_ids(r.completion_ids),
                                                        unpack_logprobs(r.completion_logprobs)))
                extra[r.id] = (r.response_text, r.tool_calls)
        if missing:
            requests = self._requests([r.id for r in missing])
            for r in missing:
                prompt, completion = retokenize(self.tokenizer, r.endpoint, requests[r.id], r.response_text or "",
                                                r.tool_calls)
                calls[r.rollout_id].append(_call_tokens(r, prompt, completion, None, retokenized=True))
                extra[r.id] = (r.response_text, r.tool_calls)
                works[r.rollout_id].stats["retokenized"] += 1
        placed: list[tuple[RolloutWork, SessionTree, int]] = []
        for rid, w in works.items():
            w.trees = build_forest(calls[rid])
            first = min(calls[rid], key=lambda c: c.seq, default=None)
            w.central = self.opts.central_agent or (first.agent if first else None)
            placed.extend((w, tree, i) for tree in w.trees for i in range(len(tree.nodes)))
        if placed:
            classes = batch_token_classes([t.nodes[i].call.completion for _, t, i in placed], self.token_text,
                                          [extra[t.nodes[i].call.call_id][1] for _, t, i in placed],
                                          self.opts.class_config)
            for (w, tree, i), cls in zip(placed, classes):
                c = tree.nodes[i].call
                text, native = extra[c.call_id]
                w.units[c.call_id] = Unit(c, tree, i, cls, text or "", native)
        self._edges(list(works.values()))
        return list(works.values())

    def _edges(self, works: list[RolloutWork]) -> None:
        """Cross-session edges: the recorded parent call, else inferred (METHODS §2)."""
        need: dict[str, list[tuple[RolloutWork, str, CallTokens]]] = defaultdict(list)
        for w in works:
            for tree in w.trees:
                first = tree.nodes[0].call
                if first.agent == w.central:
                    continue
                if first.parent_call_id:
                    w.edges[tree.key] = first.parent_call_id
                else:
                    need[w.id].append((w, tree.key, first))
        if not need:
            return
        requests = self._requests([c.call_id for items in need.values() for _, _, c in items])
        for items in need.values():
            w = items[0][0]
            central = [(u.call.seq, u.call.call_id, _dispatched_texts(u.parse()))
                       for u in w.units.values() if u.call.agent == w.central]
            sessions = [(key, c.seq, _first_user_text(requests.get(c.call_id, {}))) for _, key, c in items]
            w.edges.update(infer_parent_calls(central, sessions))

    # -- rewards and advantages -----------------------------------------------------------
    def _rewards(self, works: list[RolloutWork]) -> None:
        ids = [w.id for w in works]
        reported: dict[str, list[tuple[str | None, str, str, float]]] = defaultdict(list)
        with self.engine.connect() as conn:
            q = (select(Reward.rollout_id, Reward.call_id, Reward.kind, Reward.name, Reward.value)
                 .where(Reward.rollout_id.in_(ids)).order_by(Reward.id))
            for r in conn.execute(q):
                reported[r.rollout_id].append((r.call_id, r.kind, r.name, r.value))
        needs_requests = "tool_format" in self.opts.process or "dispatch_ok" in self.opts.process
        requests = self._requests([c for w in works for c in w.units]) if needs_requests else {}
        for w in works:
            task = self.tasks.get(w.task_id or "", {})
            if self.reward_fn is not None:
                answer = self._final_answer(w)
                w.outcome, w.has_outcome = float(self.reward_fn(answer or "", task.get("reference"))), True
            for call_id, kind, name, value in reported[w.id]:
                if kind == "outcome" and self.reward_fn is None:
                    w.outcome, w.has_outcome = float(value), True  # the latest report wins
                elif kind == "process" and call_id in w.units:
                    w.units[call_id].process[name] = float(value)
            if "tool_format" in self.opts.process:
                for u in w.units.values():
                    u.process["tool_format"] = tool_format(u.parse().calls, requests[u.call.call_id].get("tools"))
            if "dispatch_ok" in self.opts.process:
                for u in w.units.values():
                    node = u.tree.nodes[u.node]
                    results = observed_results(requests[u.tree.nodes[node.children[0]].call.call_id]
                                               .get("messages") or []) if node.children else []
                    u.process["dispatch_ok"] = dispatch_ok(len(u.parse().calls), results)
            if "matchtir" in self.opts.process or self.opts.advantage == "matchtir":
                for u, r in zip(self._turns(w), self._matchtir_turns(w, task)):
                    u.process["matchtir"] = r
            if not w.has_outcome:
                w.stats["no_outcome"] += 1

    def _final_answer(self, w: RolloutWork) -> str | None:
        central = [u for u in w.units.values() if u.call.agent == w.central]
        return max(central, key=lambda u: u.call.seq).parse().answer if central else None

    def _trained(self, w: RolloutWork, agent: str | None) -> bool:
        scope = self.opts.train_agents
        if scope == "all":
            return True
        if scope == "central":
            return agent == w.central
        return agent in {a.strip() for a in scope.split(",")}

    def _turns(self, w: RolloutWork) -> list[Unit]:
        """The rollout's decision units of the trained agents in seq order (MatchTIR's turns)."""
        return sorted((u for u in w.units.values() if self._trained(w, u.call.agent)), key=lambda u: u.call.seq)

    def _matchtir_turns(self, w: RolloutWork, task: dict[str, Any]) -> list[float]:
        turns = self._turns(w)
        refs = reference_calls(task.get("reference_calls"))
        preds, owner = [], []
        for t, u in enumerate(turns):
            for c in u.parse().calls:
                preds.append((c.name, c.arguments))
                owner.append(t)
        per_call = call_rewards(preds, refs, self.opts.matcher) if preds else []
        by_turn: list[list[float]] = [[] for _ in turns]
        for t, r in zip(owner, per_call):
            by_turn[t].append(r)
        final = len(turns) - 1 if turns and not turns[-1].parse().calls else None
        answer = turns[-1].parse().answer if final is not None else None
        return turn_rewards(by_turn, final, f1(answer or "", task.get("reference")) if final is not None else 0.0)

    def _advantages(self, works: list[RolloutWork]) -> None:
        o, cfg = self.opts, self.opts.adv_config
        groups = {w.id: w.group_id for w in works}
        if o.advantage == "grpo":
            a = adv.grpo({w.id: w.outcome for w in works}, groups, cfg)
            for w in works:
                for u in w.units.values():
                    u.advantage = a[w.id]
        elif o.advantage == "harness":
            units = {}
            for w in works:
                for cid, u in w.units.items():
                    r = float(np.mean(list(u.process.values()))) if u.process else None
                    units[cid] = (w.id, u.call.agent or "", u.tree.nodes[u.node].decision_index, r)
            a = adv.harness({w.id: w.outcome for w in works}, groups, units, cfg)
            for w in works:
                for cid, u in w.units.items():
                    u.advantage = a[cid]
        elif o.advantage == "matpo":
            fmt_p, fmt_w = {}, {}
            for w in works:
                scores = {cid: tool_format(u.parse().calls, None) if "tool_format" not in u.process
                          else u.process["tool_format"] for cid, u in w.units.items()}
                planner = [scores[c] for c, u in w.units.items() if u.call.agent == w.central]
                fmt_p[w.id] = float(np.mean(planner)) if planner else 0.0
                fmt_w[w.id] = [float(np.mean([scores[n.call.call_id] for n in t.nodes]))
                               for t in w.trees if t.nodes[0].call.agent != w.central]
            a = adv.matpo({w.id: w.outcome for w in works}, fmt_p, fmt_w, groups, cfg)
            for w in works:
                for u in w.units.values():
                    u.advantage = a[w.id]
        else:  # matchtir
            turns = {w.id: self._turns(w) for w in works}
            a = adv.matchtir({k: [u.process["matchtir"] for u in ts] for k, ts in turns.items()}, groups, cfg)
            for k, ts in turns.items():
                for u, value in zip(ts, a[k]):
                    u.advantage = value

    # -- emitting -------------------------------------------------------------------------
    def _emit(self, w: RolloutWork, writer: SampleWriter) -> None:
        s = w.stats
        for tree in w.trees:
            s["sessions"] += 1
            for node in tree.nodes:
                s["tokens_recorded"] += node.call.s_len
                if node.parent >= 0:
                    s["merges"] += 1
                else:
                    s[f"roots_{node.cause}"] += 1
            agent = tree.nodes[0].call.agent
            if not self._trained(w, agent):
                s["untrained_sessions"] += 1
                continue
            for path in linear_paths(tree):
                n = writer.add(self._sample(w, tree, path.nodes, path.trainable))
                s["samples"] += 1
                s["tokens_emitted"] += n
        if s["samples"] and w.task_id:
            self.tasks_with_samples.add(w.task_id)
        s["outcome"] = w.outcome
        self.per_rollout[w.id] = dict(s)
        for k, v in s.items():
            if k != "outcome":
                self.totals[k] += v

    def _sample(self, w: RolloutWork, tree: SessionTree, nodes: list[int], trainable: list[bool]) -> dict[str, Any]:
        leaf = tree.nodes[nodes[-1]].call
        ids = np.concatenate([leaf.prompt, leaf.completion])
        n = len(ids)
        mask = np.zeros(n, dtype=np.int8)
        cls = np.zeros(n, dtype=np.int8)
        advantage = np.zeros(n, dtype=np.float32)
        blp = np.zeros(n, dtype=np.float32)
        blp_valid = np.zeros(n, dtype=bool)
        turn = np.full(n, -1, dtype=np.int16)
        process: dict[str, dict[str, float]] = {}
        for i, own in zip(nodes, trainable):
            node = tree.nodes[i]
            c = node.call
            a, b = len(c.prompt), c.s_len
            turn[a:b] = node.decision_index
            u = w.units[c.call_id]
            if u.process:
                process[c.call_id] = u.process
            if not own:
                continue
            mask[a:b] = 1
            cls[a:b] = u.classes
            advantage[a:b] = u.advantage
            if c.logprobs is not None and len(c.logprobs) == b - a:
                blp[a:b] = c.logprobs
                blp_valid[a:b] = True
            w.stats["trainable_tokens"] += b - a
        for k, count in enumerate(np.bincount(cls, minlength=len(CLASS_NAMES)).tolist()):
            if k:
                w.stats[f"class_{CLASS_NAMES[k]}"] += count
        breakdown = {"outcome": w.outcome, "process": process, "advantage": self.opts.advantage,
                     "parent_call": w.edges.get(tree.key)}
        return {
            "sample_id": f"{w.id}/{tree.key}/{leaf.call_id}",
            "rollout_id": w.id, "task_id": w.task_id, "group_id": w.group_id,
            "agent": leaf.agent, "session_id": leaf.session_id,
            "input_ids": ids, "loss_mask": mask, "token_class": cls, "advantage": advantage,
            "behaviour_logprob": (blp, blp_valid), "turn_index": turn,
            "call_ids": [tree.nodes[i].call.call_id for i in nodes],
            "prompt_len": len(tree.nodes[nodes[0]].call.prompt),
            "weight_version": leaf.weight_version, "outcome_reward": w.outcome,
            "reward_breakdown": json.dumps(breakdown, sort_keys=True),
            "retokenized": any(tree.nodes[i].call.retokenized for i in nodes),
        }

    def _write_tasks(self, path: Path) -> None:
        rows = {k: [] for k in TASK_SCHEMA.names}
        for tid in sorted(self.tasks_with_samples):
            t = self.tasks.get(tid)
            if t is None:
                continue
            rows["task_id"].append(tid)
            rows["input"].append(json.dumps(t["input"]))
            rows["reference"].append(json.dumps(t["reference"]))
            rows["reference_calls"].append(json.dumps(t["reference_calls"]) if t["reference_calls"] is not None else None)
            rows["expert_trace"].append(json.dumps(structure_trace(t["expert_trace"])) if t["expert_trace"] else None)
        pq.write_table(pa.table(rows, schema=TASK_SCHEMA), path)


def _call_tokens(r: Any, prompt: np.ndarray, completion: np.ndarray, logprobs: np.ndarray | None,
                 retokenized: bool = False) -> CallTokens:
    return CallTokens(call_id=r.id, seq=r.seq, key=session_key(r.session_id, r.agent), prompt=prompt,
                      completion=completion, logprobs=logprobs, agent=r.agent, session_id=r.session_id,
                      parent_call_id=r.parent_call_id, weight_version=r.weight_version, retokenized=retokenized)


def _group_batches(rollouts: list[tuple[str, str | None, str]], size: int):
    """Batches of whole groups (rollouts arrive sorted by group)."""
    batch: list[tuple[str, str | None, str]] = []
    for i, r in enumerate(rollouts):
        batch.append(r)
        last_of_group = i + 1 == len(rollouts) or rollouts[i + 1][2] != r[2]
        if last_of_group and len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _dispatched_texts(parsed: ParsedResponse) -> list[str]:
    return [v for c in parsed.calls for v in (c.arguments or {}).values() if isinstance(v, str) and len(v) >= 8]


def _first_user_text(request: dict[str, Any]) -> str:
    for m in request.get("messages") or []:
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else json.dumps(c)
    prompt = request.get("prompt")
    return prompt if isinstance(prompt, str) else ""


def retokenize(tokenizer: Any, endpoint: str, request: dict[str, Any], text: str,
               tool_calls: list[Any] | None) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and completion ids of a call recorded without ids, re-rendered with the chat
    template (flagged `retokenized`: the ids may differ from what the model sampled)."""
    def enc(s: str) -> np.ndarray:
        return np.asarray(tokenizer.encode(s, add_special_tokens=False), dtype=np.int32)

    if endpoint != "chat":
        return enc(request.get("prompt") or ""), enc(text)
    messages, tools = request.get("messages") or [], request.get("tools")
    prompt_text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    reply = {"role": "assistant", "content": text}
    if tool_calls:
        reply["tool_calls"] = tool_calls
    full_text = tokenizer.apply_chat_template(messages + [reply], tools=tools, tokenize=False)
    prompt = enc(prompt_text)
    if full_text.startswith(prompt_text):
        completion = enc(full_text[len(prompt_text):])
        eos = np.flatnonzero(completion == tokenizer.eos_token_id)
        if len(eos):  # the template's newline after EOS is not generated
            completion = completion[: eos[-1] + 1]
        return prompt, completion
    return prompt, np.concatenate([enc(text), np.asarray([tokenizer.eos_token_id], dtype=np.int32)])


class SampleWriter:
    """Buffers samples and writes Parquet row groups built from flat numpy arrays."""

    def __init__(self, path: Path, flush_tokens: int):
        self.path = path
        self.flush_tokens = flush_tokens
        self.rows: list[dict[str, Any]] = []
        self.pending = 0
        # dictionary-encode the identity strings only: token lists are high-cardinality
        self.writer = pq.ParquetWriter(path, SAMPLE_SCHEMA, use_dictionary=[
            "rollout_id", "task_id", "group_id", "agent", "session_id", "weight_version"])

    def add(self, row: dict[str, Any]) -> int:
        self.rows.append(row)
        n = len(row["input_ids"])
        self.pending += n
        if self.pending >= self.flush_tokens:
            self.flush()
        return n

    def flush(self) -> None:
        if not self.rows:
            return
        rows = self.rows
        lengths = np.array([len(r["input_ids"]) for r in rows], dtype=np.int32)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))

        def lst(name: str, typ: pa.DataType) -> pa.Array:
            flat = np.concatenate([r[name] for r in rows])
            return pa.ListArray.from_arrays(offsets, pa.array(flat, type=typ))

        blp_vals = np.concatenate([r["behaviour_logprob"][0] for r in rows])
        blp_valid = np.concatenate([r["behaviour_logprob"][1] for r in rows])
        blp = pa.ListArray.from_arrays(offsets, pa.array(blp_vals, type=pa.float32(), mask=~blp_valid))
        columns = {
            "input_ids": lst("input_ids", pa.int32()),
            "loss_mask": lst("loss_mask", pa.int8()),
            "token_class": lst("token_class", pa.int8()),
            "advantage": lst("advantage", pa.float32()),
            "behaviour_logprob": blp,
            "turn_index": lst("turn_index", pa.int16()),
        }
        arrays = []
        for f in SAMPLE_SCHEMA:
            if f.name in columns:
                arrays.append(columns[f.name])
            else:
                arrays.append(pa.array([r[f.name] for r in rows], type=f.type))
        self.writer.write_table(pa.Table.from_arrays(arrays, schema=SAMPLE_SCHEMA))
        self.rows, self.pending = [], 0

    def close(self) -> None:
        self.flush()
        self.writer.close()
