"""`harnessrl compile`: records DB → `samples.parquet`, `tasks.parquet`, `stats.json`.

The pipeline, one batch of whole groups at a time (memory bounded by a batch; every group's
advantages are computed before its samples are written):

    reader.Reader.read_batch   SQL → prefix trees and decision units (retokenize.py for calls
                               without ids; labels.py for token classes)
    scoring.Scorer.score       outcome and process rewards
    estimators.get(name).fn    advantages (the `--advantage` registry)
    assemble.emit              linear samples
    writer.SampleWriter        Parquet row groups; writer.write_tasks for tasks.parquet

Rollouts without an outcome are left out of the groups and the samples when the estimator uses
the outcome (`missing_outcome="skip"`, the default) or scored 0 (`"zero"`). Rollouts in which the
harness was answered an error (a refused or failed call: `Rollout.errors`) are left out the same
way (`on_call_error="drop"`, the default): the harness did not run as it was meant to, so its
outcome says nothing about the policy, and as a group member it would shift every other
member's advantage (two refused rollouts scored 0 gave the third A = +1.155). Rollouts finished
as `failed` (a crash, a timeout, a lost node, an attempt that was retried) are not read at all.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from harnessrl.compiler import estimators, parallel
from harnessrl.compiler.advantages import AdvantageConfig
from harnessrl.compiler.assemble import emit, tree_stats
from harnessrl.compiler.labels import ClassConfig
from harnessrl.compiler.reader import Reader, RolloutWork, group_batches, parse_since
from harnessrl.compiler.rewards import load_reward_fn
from harnessrl.compiler.scoring import Scorer
from harnessrl.compiler.writer import SampleWriter, write_tasks
from harnessrl.db import db_url, open_db
from harnessrl.errors import UserError
from harnessrl.sampling_policy import SamplingPolicy, violations

PROCESS_REWARDS = ("tool_format", "dispatch_ok", "matchtir")
MISSING_OUTCOME = ("skip", "zero")
ON_CALL_ERROR = ("drop", "keep")
POLICY_ACTIONS = ("drop", "mask", "flag")
STAT_KEYS = ("calls", "failed", "call_errors", "dropped_call_error", "text_only", "discarded", "embeddings", "retokenized", "sessions", "samples", "merges", "roots_start", "roots_branch",
             "roots_drift", "roots_rewrite", "unmerged_rewrites", "untrained_sessions", "no_outcome",
             "skipped_no_outcome", "singleton_groups", "singleton_buckets", "masked_truncated", "policy_violations",
             "policy_dropped",
             "policy_masked", "policy_flagged", "tokens_recorded", "tokens_emitted", "trainable_tokens",
             "class_reasoning", "class_action", "class_args", "class_format")


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
    central_agent: str | None = None  # default: `reader.default_central`
    missing_outcome: str = "skip"  # a rollout without an outcome: skip (left out) | zero (R = 0)
    on_call_error: str = "drop"  # a rollout with a refused or failed call: drop (left out) | keep
    mask_truncated: bool = False  # a path whose last call was cut by max_tokens: that turn gets mask 0
    sampling_policy: SamplingPolicy | None = None  # calls sampled against it are handled by policy_action
    policy_action: str = "drop"  # drop (the sample) | mask (the turn) | flag (keep, count)
    adv_config: AdvantageConfig = field(default_factory=AdvantageConfig)
    class_config: ClassConfig = field(default_factory=ClassConfig)
    batch_rollouts: int = 256
    flush_tokens: int = 4_000_000  # write a row group once this many tokens are pending
    jobs: int = 0  # worker processes for batches (0: one per CPU); one batch or jobs=1: in this process


def validate(opts: CompileOptions) -> None:
    estimators.get(opts.advantage)
    for p in opts.process:
        if p not in PROCESS_REWARDS:
            raise UserError(f"unknown process reward {p!r}: use {', '.join(PROCESS_REWARDS)}")
    if opts.matcher not in ("hungarian", "greedy"):
        raise UserError(f"unknown matcher {opts.matcher!r}: use hungarian or greedy")
    if opts.missing_outcome not in MISSING_OUTCOME:
        raise UserError(f"--missing-outcome {opts.missing_outcome!r}: use {' or '.join(MISSING_OUTCOME)}")
    if opts.on_call_error not in ON_CALL_ERROR:
        raise UserError(f"--on-call-error {opts.on_call_error!r}: use {' or '.join(ON_CALL_ERROR)}")
    if opts.reward is not None:
        load_reward_fn(opts.reward)
    if opts.since is not None:
        parse_since(opts.since)
    if opts.policy_action not in POLICY_ACTIONS:
        raise UserError(f"--policy-action {opts.policy_action!r}: use {', '.join(POLICY_ACTIONS)}")


class Compiler:
    def __init__(self, db: str, opts: CompileOptions):
        validate(opts)
        url = db_url(db)
        if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
            raise UserError(f"records DB not found: {db}")
        self.db, self.opts = db, opts
        self.engine, _ = open_db(db)
        self.reader = Reader(self.engine, opts.tokenizer, opts.central_agent, opts.class_config)
        self.estimator = estimators.get(opts.advantage)
        self.tasks: dict[str, dict[str, Any]] = {}
        self.scorer = Scorer(self.reader, self.tasks, load_reward_fn(opts.reward) if opts.reward else None,
                             opts.process, opts.train_agents, opts.matcher, opts.adv_config.lambda_pen,
                             self.estimator.needs_counts, self.estimator.needs_matchtir)
        self.totals: Counter = Counter(dict.fromkeys(STAT_KEYS, 0))
        self.per_rollout: dict[str, dict[str, Any]] = {}
        self.tasks_with_samples: set[str] = set()
        self.violations: dict[str, list[str]] = {}  # call id -> reasons (the first 100 off-policy calls)

    def run(self, on_progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        start = time.perf_counter()
        o = self.opts
        o.out.mkdir(parents=True, exist_ok=True)
        rollouts = self.reader.select_rollouts(o.rollouts, o.run, o.since, skip_failed=True)
        self.reader.load_tasks({t for _, t, _ in rollouts if t}, self.tasks)
        writer = SampleWriter(o.out / "samples.parquet", o.flush_tokens)
        batches = list(group_batches(rollouts, o.batch_rollouts))
        jobs = min(o.jobs or default_jobs(), len(batches))
        counts: Counter = Counter()
        done = 0
        if jobs > 1:
            self.engine.dispose()  # no pooled connection crosses into the workers
            outs = parallel.map_batches(self.db, o, batches, jobs)
        else:
            outs = (self.process_batch(b, writer.add) for b in batches)
        for out in outs:
            if out.table is not None:
                writer.write(out.table)
            self.per_rollout.update(out.per_rollout)
            self.tasks_with_samples |= out.tasks_with_samples
            counts.update(out.counts)
            for call_id, reasons in out.violations.items():
                if len(self.violations) < 100:
                    self.violations[call_id] = reasons
            done += len(out.per_rollout)
            if on_progress:
                on_progress(done, len(rollouts))
        writer.close()
        write_tasks(o.out / "tasks.parquet", self.tasks, self.tasks_with_samples)
        t = self.totals
        for rid_stats in self.per_rollout.values():
            for k, v in rid_stats.items():
                if k != "outcome":
                    t[k] += v
        t.update(counts)
        t["rollouts"] = len(rollouts)
        t["token_saving"] = t["tokens_recorded"] / t["tokens_emitted"] if t["tokens_emitted"] else 0.0
        t["seconds"] = time.perf_counter() - start
        stats = {"totals": dict(t), "rollouts": self.per_rollout, "policy_violations": self.violations,
                 "options": {"reward": o.reward, "process": list(o.process), "advantage": o.advantage,
                             "train_agents": o.train_agents, "matcher": o.matcher,
                             "missing_outcome": o.missing_outcome, "on_call_error": o.on_call_error,
                             "mask_truncated": o.mask_truncated,
                             "sampling_policy": asdict(o.sampling_policy) if o.sampling_policy else None,
                             "policy_action": o.policy_action,
                             "adv_config": o.adv_config.as_dict(),
                             "unmarked_answer": o.class_config.unmarked_answer}}
        (o.out / "stats.json").write_bytes(orjson.dumps(stats, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        return stats

    def _off_policy(self, works: list[RolloutWork], out: BatchOut) -> frozenset[str]:
        """Ids of the batch's calls whose recorded parameters break the sampling policy (each
        counted in its rollout's `policy_violations`; the first reasons kept in stats.json)."""
        owner = {n.call.call_id: w for w in works for tree in w.trees for n in tree.nodes}
        bad = set()
        for call_id, request in self.reader.requests(list(owner)).items():
            reasons = violations(self.opts.sampling_policy, request or {})  # type: ignore[arg-type]
            if reasons:
                bad.add(call_id)
                owner[call_id].stats["policy_violations"] += 1
                if len(out.violations) < 100:
                    out.violations[call_id] = reasons
        return frozenset(bad)

    def _unmerged_rewrites(self, works: list[RolloutWork]) -> None:
        """Count the new roots whose call re-sent an earlier reply in the harness's own form that
        no rewrite rule merged (the proxy noted it as `harnessrl_rewrite`, docs/methods.md §2).
        Only drift and rewrite roots can be such calls, so only their requests are read."""
        owner = {n.call.call_id: w for w in works for tree in w.trees for n in tree.nodes
                 if n.parent < 0 and n.cause in ("drift", "rewrite")}
        for call_id, request in (self.reader.requests(list(owner)) if owner else {}).items():
            if isinstance(request, dict) and "harnessrl_rewrite" in request:
                owner[call_id].stats["unmerged_rewrites"] += 1

    def process_batch(self, batch: list, add: Callable[[dict[str, Any]], int]) -> BatchOut:
        """One batch of whole groups: read, score, advantages, samples passed to `add`. The
        batch's tasks must be in `self.tasks` (the reward functions read their references)."""
        o = self.opts
        works = self.reader.read_batch(batch)
        self.scorer.score(works)
        skip = o.missing_outcome == "skip" and self.estimator.uses_outcome
        drop = o.on_call_error == "drop"
        kept = [w for w in works if (w.has_outcome or not skip) and not (drop and w.errors)]
        ctx = estimators.EstimatorContext(o.adv_config, o.train_agents)
        self.estimator.fn(kept, ctx)
        kept_ids = {w.id for w in kept}
        out = BatchOut(counts=ctx.counts)
        off_policy = self._off_policy(works, out) if o.sampling_policy is not None else frozenset()
        self._unmerged_rewrites(works)
        for w in works:
            tree_stats(w)
            if w.id in kept_ids:
                emit(w, add, o.train_agents, o.advantage, o.mask_truncated, off_policy, o.policy_action)
            elif drop and w.errors:
                w.stats["dropped_call_error"] += 1
            else:
                w.stats["skipped_no_outcome"] += 1
            if w.scorer_finished and not w.has_outcome:
                w.stats["scorer_no_outcome"] += 1
            s = w.stats
            if s["samples"] and w.task_id:
                out.tasks_with_samples.add(w.task_id)
            s["outcome"] = w.outcome if w.has_outcome else None
            out.per_rollout[w.id] = dict(s)
        return out


def default_jobs() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass
class BatchOut:
    """What one batch adds to the compile: its samples as one Arrow table (from a worker process;
    None when written as they came), per-rollout stats, tasks with samples, estimator counts,
    and the reasons of its first off-policy calls."""

    table: Any = None
    per_rollout: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks_with_samples: set[str] = field(default_factory=set)
    counts: Counter = field(default_factory=Counter)
    violations: dict[str, list[str]] = field(default_factory=dict)
