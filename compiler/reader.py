"""Stage 1 of `harnessrl compile`: records DB → per-rollout work (prefix trees, decision units).

Rollouts are selected and read a batch of whole groups at a time (calls in `(rollout, seq)`
index order), so memory is bounded by a batch. A call without ids is re-rendered
(`retokenize`); every id is checked against the tokenizer's vocabulary before it is decoded.
The request JSON is read only for calls that need it (re-rendering, edges, process rewards).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select

from harnessrl.compiler.labels import ClassConfig, batch_token_classes
from harnessrl.compiler.response import ParsedResponse, parse_response
from harnessrl.compiler.retokenize import retokenize
from harnessrl.compiler.tokentext import TokenText
from harnessrl.compiler.trees import CallTokens, SessionTree, build_forest, infer_parent_calls, session_key
from harnessrl.errors import UserError
from harnessrl.records import TEXT_ONLY, Call, ExpertTrace, Rollout, Task, unpack_ids, unpack_logprobs

Selected = tuple[str, str | None, str]  # rollout id, task id, group id


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
    calls_attempted: int = 0  # set by scoring when an estimator or tool_format needs them
    calls_valid: int = 0
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
    errors: int = 0  # calls the harness was answered with an error while the rollout ran (`Rollout.errors`)
    # finished with its outcome the scorer's to report (`outcome_by: scorer`: tests, --reward-from): one
    # without an outcome is a scorer fault, not the policy's doing, and compile says so (issue 54)
    scorer_finished: bool = False


def parse_since(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise UserError(f"--since {value!r}: expected epoch seconds or an ISO date-time") from None


class Reader:
    def __init__(self, engine: Any, tokenizer: str | None = None, central_agent: str | None = None,
                 class_config: ClassConfig | None = None):
        self.engine = engine
        self.tokenizer_path = tokenizer  # directory; default: the recorded model, when it is one
        self.central_agent = central_agent  # default: `default_central`
        self.class_config = class_config or ClassConfig()
        self._tokenizer: Any = None
        self._tt: TokenText | None = None

    # -- selection and side tables ----------------------------------------------------------
    def select_rollouts(self, rollouts: tuple[str, ...] = (), run: str | None = None,
                        since: str | None = None, skip_failed: bool = False) -> list[Selected]:
        """`skip_failed`: leave out rollouts finished as failed (a crash, a timeout, a lost node, an
        attempt that was retried): they did not run to their end, and do not count."""
        q = select(Rollout.id, Rollout.task_id, Rollout.group_id)
        if skip_failed:
            q = q.where(Rollout.status != "failed")
        if rollouts:
            q = q.where(Rollout.id.in_(list(rollouts)))
        if run:
            q = q.where(Rollout.run == run)
        if since:
            q = q.where(Rollout.created_at >= parse_since(since))
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        # a rollout's group: its group id, else its task (K rollouts of one task), else itself
        out = [(r.id, r.task_id, r.group_id or r.task_id or r.id) for r in rows]
        return sorted(out, key=lambda r: (r[2], r[0]))

    def load_tasks(self, task_ids: set[str], into: dict[str, dict[str, Any]]) -> None:
        ids = sorted(task_ids - set(into))
        with self.engine.connect() as conn:
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                for t in conn.execute(select(Task.id, Task.input, Task.reference, Task.reference_calls)
                                      .where(Task.id.in_(chunk))):
                    into[t.id] = {"input": t.input, "reference": t.reference,
                                  "reference_calls": t.reference_calls, "expert_trace": None}
                traces = conn.execute(select(ExpertTrace.task_id, ExpertTrace.messages)
                                      .where(ExpertTrace.task_id.in_(chunk)).order_by(ExpertTrace.id)).all()
                for tr in traces:  # the latest trace of a task wins
                    into[tr.task_id]["expert_trace"] = tr.messages

    def requests(self, call_ids: list[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        with self.engine.connect() as conn:
            for i in range(0, len(call_ids), 500):
                for r in conn.execute(select(Call.id, Call.request).where(Call.id.in_(call_ids[i:i + 500]))):
                    out[r.id] = r.request
        return out

    # -- the tokenizer ----------------------------------------------------------------------
    def tokenizer_dir(self) -> str:
        path = self.tokenizer_path or self._recorded_model_dir()
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

            self._tokenizer = self._load(AutoTokenizer.from_pretrained)
        return self._tokenizer

    @property
    def token_text(self) -> TokenText:
        if self._tt is None:
            self._tt = self._load(TokenText.from_dir)
        return self._tt

    def _load(self, loader: Any) -> Any:
        path = self.tokenizer_dir()
        try:
            return loader(path)
        except Exception as exc:  # noqa: BLE001 - a user path that holds no tokenizer
            raise UserError(f"cannot load a tokenizer from {path}: {exc}") from None

    def _recorded_model_dir(self) -> str | None:
        with self.engine.connect() as conn:
            for (model,) in conn.execute(select(Call.model).where(Call.model.is_not(None)).distinct().limit(20)):
                if model and Path(model).is_dir():
                    return model
        return None

    # -- a batch ----------------------------------------------------------------------------
    def read_batch(self, batch: list[Selected]) -> list[RolloutWork]:
        works = {rid: RolloutWork(rid, task, group) for rid, task, group in batch}
        calls: dict[str, list[CallTokens]] = defaultdict(list)
        extra: dict[str, tuple[str | None, list[Any] | None]] = {}
        missing: list[Any] = []
        cols = (Call.id, Call.rollout_id, Call.seq, Call.session_id, Call.agent, Call.parent_call_id,
                Call.status, Call.prompt_ids, Call.completion_ids, Call.completion_logprobs,
                Call.response_text, Call.tool_calls, Call.weight_version, Call.endpoint, Call.prompt_path,
                Call.finish_reason)
        q = select(*cols).where(Call.rollout_id.in_(list(works))).order_by(Call.rollout_id, Call.seq)
        with self.engine.connect() as conn:
            cols_ro = (Rollout.id, Rollout.errors, Rollout.meta, Rollout.status)
            for rid, errors, meta, status in conn.execute(select(*cols_ro).where(Rollout.id.in_(list(works)))):
                if errors:
                    works[rid].errors = errors
                    works[rid].stats["call_errors"] = errors
                works[rid].scorer_finished = status == "finished" and isinstance(meta, dict) and \
                    meta.get("outcome_by") == "scorer"
            for r in conn.execute(q):
                w = works[r.rollout_id]
                if r.endpoint == "embeddings":  # recorded for the trace, never a sample
                    w.stats["embeddings"] += 1
                    continue
                w.stats["calls"] += 1
                if r.status == "discarded":  # a best_of sample the harness never saw
                    w.stats["discarded"] += 1
                    continue
                if r.status != "ok":
                    w.stats["failed"] += 1
                    continue
                if r.prompt_path == TEXT_ONLY:  # no sampled ids or log-probs: an expert trace at most
                    w.stats["text_only"] += 1
                    continue
                if r.prompt_ids is None or r.completion_ids is None:
                    missing.append(r)
                    continue
                calls[r.rollout_id].append(_call_tokens(r, unpack_ids(r.prompt_ids), unpack_ids(r.completion_ids),
                                                        unpack_logprobs(r.completion_logprobs)))
                extra[r.id] = (r.response_text, r.tool_calls)
        if missing:
            requests = self.requests([r.id for r in missing])
            for r in missing:
                prompt, completion = retokenize(self.tokenizer, r.endpoint, requests[r.id], r.response_text or "",
                                                r.tool_calls)
                calls[r.rollout_id].append(_call_tokens(r, prompt, completion, None, retokenized=True))
                extra[r.id] = (r.response_text, r.tool_calls)
                works[r.rollout_id].stats["retokenized"] += 1
        placed: list[tuple[RolloutWork, SessionTree, int]] = []
        for rid, w in works.items():
            w.central = self.central_agent or default_central(calls[rid])
            w.trees = build_forest(calls[rid], w.central)
            placed.extend((w, tree, i) for tree in w.trees for i in range(len(tree.nodes)))
        if placed:
            tt = self.token_text
            completions = [t.nodes[i].call.completion for _, t, i in placed]
            self._check_vocabulary(placed, tt)
            classes = batch_token_classes(completions, tt, [extra[t.nodes[i].call.call_id][1] for _, t, i in placed],
                                          self.class_config)
            for (w, tree, i), cls in zip(placed, classes):
                c = tree.nodes[i].call
                text, native = extra[c.call_id]
                w.units[c.call_id] = Unit(c, tree, i, cls, text or "", native)
        self._edges(list(works.values()))
        return list(works.values())

    def _check_vocabulary(self, placed: list[tuple[RolloutWork, SessionTree, int]], tt: TokenText) -> None:
        """Every recorded id must be a token of this tokenizer (else it is another model's). A
        prompt is checked only past its parent's S (the rest was checked there): one max over
        about the emitted tokens, not the recorded ones."""
        pieces = []
        for _, tree, i in placed:
            node = tree.nodes[i]
            start = tree.nodes[node.parent].call.s_len if node.parent >= 0 else 0
            pieces.append(node.call.prompt[start:])
            pieces.append(node.call.completion)
        if int(np.concatenate(pieces).max(initial=0)) < tt.sep:
            return
        for _, tree, i in placed:
            c = tree.nodes[i].call
            tt.check_ids(np.concatenate([c.prompt, c.completion]), f"call {c.call_id}", self.tokenizer_dir())

    def _edges(self, works: list[RolloutWork]) -> None:
        """Cross-session edges: the recorded parent call, else inferred (docs/methods.md §2)."""
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
        requests = self.requests([c.call_id for items in need.values() for _, _, c in items])
        for items in need.values():
            w = items[0][0]
            central = [(u.call.seq, u.call.call_id, _dispatched_texts(u.parse()))
                       for u in w.units.values() if u.call.agent == w.central]
            sessions = [(key, c.seq, _first_user_text(requests.get(c.call_id, {}))) for _, key, c in items]
            w.edges.update(infer_parent_calls(central, sessions))


def group_batches(rollouts: list[Selected], size: int):
    """Batches of whole groups (rollouts arrive sorted by group)."""
    batch: list[Selected] = []
    for i, r in enumerate(rollouts):
        batch.append(r)
        last_of_group = i + 1 == len(rollouts) or rollouts[i + 1][2] != r[2]
        if last_of_group and len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


# an agent the proxy named after the call's model and system prompt (proxy/identity.py:
# `unnamed_agent`), because the harness gave no identity
_DERIVED_AGENT = re.compile(r"@[0-9a-f]{4}$")


def default_central(calls: list[CallTokens]) -> str | None:
    """The central agent when none is given (`CompileOptions.central_agent`): the agent of the rollout's first
    call. When the proxy named that agent (the harness gave none), its first call is often a side
    call (Claude Code's title call is sent beside, and often before, the main loop's first call),
    so the central agent is then the proxy-named agent that made the most calls, ties going to the
    one that called first."""
    if not calls:
        return None
    order = sorted(calls, key=lambda c: c.seq)
    if not _DERIVED_AGENT.search(order[0].agent or ""):
        return order[0].agent
    counts = Counter(c.agent for c in order if _DERIVED_AGENT.search(c.agent or ""))
    return max(counts, key=lambda a: counts[a])  # max keeps the first of equals: dicts keep call order


def _call_tokens(r: Any, prompt: np.ndarray, completion: np.ndarray, logprobs: np.ndarray | None,
                 retokenized: bool = False) -> CallTokens:
    return CallTokens(call_id=r.id, seq=r.seq, key=session_key(r.session_id, r.agent), prompt=prompt,
                      completion=completion, logprobs=logprobs, agent=r.agent, session_id=r.session_id,
                      parent_call_id=r.parent_call_id, weight_version=r.weight_version, retokenized=retokenized,
                      finish_reason=r.finish_reason)


def _dispatched_texts(parsed: ParsedResponse) -> list[str]:
    return [v for c in parsed.calls for v in (c.arguments or {}).values() if isinstance(v, str) and len(v) >= 8]


def _first_user_text(request: dict[str, Any]) -> str:
    for m in request.get("messages") or []:
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else json.dumps(c)
    prompt = request.get("prompt")
    return prompt if isinstance(prompt, str) else ""
