"""`harnessrl loop --async`: rollouts never wait for the trainer, the trainer never waits for a round.

Three threads over one proxy and one records DB, each running the round driver's stages (`stages.py`):

- the **producer** keeps `--concurrency` rollouts in flight on the executor (a `Flight`): groups of
  `--group-size` rollouts of one training task, the tasks in a seeded order epoch after epoch,
  each group under a run tag of its own, `async-g<n>-a<attempt>`. While `--max-queued-steps`
  optimizer steps of groups wait for the trainer it starts no new group (producer idle).
- the **compiler** compiles each group alone as soon as its last rollout is in (after `settle`:
  one counted rollout per job) and queues it, with the weight versions of its trained tokens.
- the **trainer** (the calling thread) takes the oldest `--groups-per-step` × `--push-every`
  queued groups, drops each one holding a trained token sampled more than `--max-staleness`
  versions before the weights the step starts from (counted), trains `--push-every` optimizer
  steps on the rest from the newest checkpoint and pushes it while rollouts go on: a call in flight
  finishes on the weights that started it, every later call is served by the new ones and records
  their version. Every `--eval-every` steps the held-out tasks run greedily on that version, pinned
  (a second proxy on its checkpoint), on a thread of their own.

Tokens sampled by older weights are corrected by the trainer's decoupled objective
(docs/methods.md, Asynchronous RL): the clipped ratio to the weights the step starts from, times
the truncated importance weight of those weights against the behaviour policy (`tis`); on unless
--train-config sets `tis` or `ratio_to`.

Accounting (`loop_state.json`, state.py): a group goes running → rolled (its rollouts all in) →
ready (compiled) → trained, dropped (stale) or failed, each transition saved before the next
begins. A step's row, its groups' `trained` and the new `model` are saved together once the
checkpoint is written; the push is saved after. So a loop killed anywhere resumes without training
a group twice or losing a finished one: a running group's rollouts are failed (never counted), a
rolled group is compiled again, ready groups wait for the trainer, the newest checkpoint is pushed.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import deque
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from harnessrl.app.loop import stages
from harnessrl.app.loop.failpoints import hit
from harnessrl.app.loop.config import LoopConfig
from harnessrl.app.loop.groups import merge_samples, trainable, trained_versions_of
from harnessrl.app.loop.report import step_table
from harnessrl.app.loop.state import LoopState
from harnessrl.app.rollouts.executors import Executor, Flight
from harnessrl.app.rollouts.jobs import Job, counted, jobs_for, settle
from harnessrl.app.rollouts.run_cmd import owned_proxy
from harnessrl.console import Console
from harnessrl.errors import UserError
from harnessrl.proxy.server import ProxyConfig
from harnessrl.trainer.push import push
from harnessrl.trainer.run import train

WAITING = ("rolled", "ready")  # the queue: groups whose rollouts are in, compiled or not yet
DRAIN_S = 30.0  # how long the end waits for the rollouts it gave up to stop (see Flight.drain)
NO_SIGNAL = 50  # groups in a row with no token to train before the loop gives up (it would wait forever)


class AsyncDriver:
    def __init__(self, cfg: LoopConfig, ex: Executor, s: stages.Setup, state: LoopState, state_path: Path,
                 console: Console) -> None:
        self.cfg, self.ex, self.s, self.st, self.path, self.console = cfg, ex, s, state, state_path, console
        self.cond = threading.Condition(state.lock)  # a group queued, a failure
        self.stop = threading.Event()
        self.failure: list[BaseException] = []
        self.compile_q: queue.Queue[str | None] = queue.Queue()
        self.evals: list[threading.Thread] = []
        self.correction = stages.async_correction(cfg)
        self.url = ""
        self.attempt = 0
        self.no_signal = 0  # groups compiled in a row with no token to train
        self.flight: Flight | None = None

    def run(self, interrupted: int | None) -> None:
        """`interrupted`: the attempt a killed loop was in, whose rollouts outside groups (the teacher
        round's, the evaluations') are failed."""
        cfg, st, h = self.cfg, self.st, self.s.h
        st.attempts += 1
        self.attempt = st.attempts
        st.save(self.path)
        started = time.monotonic()
        with owned_proxy(stages.proxy_config(cfg, self.s.db, st, self.ex.proxy_host)) as proxy, \
                (h.around(proxy.url) if h.around else nullcontext()):
            self.url = proxy.url
            self._resume(interrupted)
            if st.initial_eval is None:
                results = stages.rollouts(self.ex, h, self.url, h.eval, 1, "eval-initial", 0.0, "eval (start)")
                _, st.initial_eval, st.initial_validity = stages.summary(results)
                st.initial_metrics = stages.means(results)
                st.save(self.path)
            threads = [threading.Thread(target=self._guard, args=(f,), name=f"async-{f.__name__}", daemon=True)
                       for f in (self._produce, self._compile_all)]
            for t in threads:
                t.start()
            try:
                self._train_all()
            finally:
                self.stop.set()
                self.compile_q.put(None)
                for t in threads:
                    t.join()
                self._end_running()
                if self.flight is not None:  # a harness whose rollout was just failed ends at its next call
                    self.flight.drain(DRAIN_S)
                for t in self.evals:
                    t.join()
            self._check()
            if st.steps and (not st.evals or st.evals[-1]["step"] != st.steps[-1]["step"]):
                self._eval(st.steps[-1]["step"], st.model, st.versions[-1], pinned=False)
            self._end_running()
        self._add("wall_s", time.monotonic() - started)
        self._totals()
        self.console.print(step_table(st))

    # -- the producer ----------------------------------------------------------------------------

    def _produce(self) -> None:
        self.flight = flight = self.ex.flight(self.s.h.run, self.url)
        try:
            self._keep_in_flight(flight)
        finally:
            flight.cancel()  # no rollout of a group left unfinished may open after _end_running

    def _keep_in_flight(self, flight: Flight) -> None:
        cfg = self.cfg
        todo: deque[tuple[str, int, Job]] = deque()
        results: dict[str, dict[int, Any]] = {}
        started: dict[tuple[str, int], float] = {}
        paused: float | None = None
        while not self.stop.is_set():
            while flight.inflight() < cfg.concurrency:
                if not todo:
                    if self._queued() >= cfg.max_queued_steps * cfg.groups_per_step:
                        paused = paused or time.monotonic()
                        break
                    if paused is not None:
                        self._add("producer_idle_s", time.monotonic() - paused)
                        paused = None
                    gid, jobs = self._new_group()
                    results[gid] = {}
                    todo.extend((gid, i, job) for i, job in enumerate(jobs))
                gid, i, job = todo.popleft()
                started[(gid, i)] = time.monotonic()
                flight.submit((gid, i), job)
            done = flight.finished(timeout=0.25)
            if not done and not flight.inflight():
                self.stop.wait(0.1)
            for (gid, i), _, result in done:
                self._add("rollout_s", time.monotonic() - started.pop((gid, i)))
                results[gid][i] = result
                if len(results[gid]) < cfg.group:
                    hit("rollouts")
                else:
                    group = results.pop(gid)
                    self._rolled(gid, [group[k] for k in range(cfg.group)])
        if paused is not None:
            self._add("producer_idle_s", time.monotonic() - paused)

    def _new_group(self) -> tuple[str, list[Job]]:
        cfg, st, h = self.cfg, self.st, self.s.h
        with st.lock:
            n = st.next_group
            st.next_group += 1
            epoch, k = divmod(n, len(h.train))
            order = list(range(len(h.train)))
            random.Random(f"{cfg.seed}/{epoch}").shuffle(order)  # every epoch its own order, the same on resume
            task = h.train[order[k]]
            tag = f"async-g{n}-a{self.attempt}"
            st.groups[str(n)] = {"task_id": h.task_id(task), "tag": tag, "status": "running"}
            st.save(self.path)
        return str(n), jobs_for(h, [task], cfg.group, tag, cfg.temperature)

    def _rolled(self, gid: str, results: list[Any]) -> None:
        g = self.st.groups[gid]
        settle(self.url, g["tag"], results)
        ids = counted(results)
        reward, success, validity = stages.summary(results)
        with self.st.lock:
            errors = [r.error for r in results if getattr(r, "error", None)]
            g.update(status="rolled", rollouts=list(ids) if ids is not None else None, reward=reward, success=success,
                     validity=validity, failed=len(errors))
            if errors:
                g["error"] = str(errors[0])[:300]  # the first, for the give-up message
            self.st.save(self.path)
        self.compile_q.put(gid)

    def _queued(self) -> int:
        with self.st.lock:
            return sum(1 for g in self.st.groups.values() if g["status"] in WAITING)

    # -- the compiler ----------------------------------------------------------------------------

    def _compile_all(self) -> None:
        while (gid := self.compile_q.get()) is not None:
            self._compile(gid)

    def _compile(self, gid: str) -> None:
        """The group alone, into its own samples directory; queued if it holds a token to train."""
        g = self.st.groups[gid]
        out = self.cfg.out / "groups" / gid / "samples"
        samples, useful, versions, tokens = 0, False, [], 0
        if g["rollouts"] != []:  # else every rollout failed: nothing to compile, never a 0 reward
            totals = stages.compile_run(self.cfg, self.s, g["tag"], out, tuple(g["rollouts"] or ()))["totals"]
            samples, tokens = int(totals.get("samples", 0)), int(totals.get("tokens_recorded", 0))
            useful = trainable(out)  # else nothing to learn: no sample, or no token the trainer would train
            versions = sorted(trained_versions_of(out), key=lambda v: v or "") if useful else []
        hit("compile")
        with self.cond:
            g.update(status="ready" if useful else "failed", samples=samples, samples_dir=str(out), versions=versions,
                     tokens=tokens)
            if not useful:
                g["why"] = ("every rollout failed" if g["rollouts"] == [] else
                            "no token to train" if samples else "no sample")
            self.no_signal = 0 if useful else self.no_signal + 1
            self.st.save(self.path)
            self.cond.notify_all()
        if self.no_signal >= NO_SIGNAL:
            last = f"; the last one's first rollout error: {g['error']}" if g.get("error") else ""
            raise UserError(f"the last {NO_SIGNAL} groups gave nothing to train (every rollout failed, no sample, or "
                            f"no token the --algo trains){last}")

    # -- the trainer -----------------------------------------------------------------------------

    def _train_all(self) -> None:
        cfg = self.cfg
        total = cfg.rounds * cfg.steps
        while (done := sum(row["steps"] for row in self.st.steps)) < total:
            n = min(cfg.push_every, total - done)
            taken = self._take(cfg.groups_per_step * n)
            self._step(done, n, taken)
            if cfg.eval_every and (done + n) // cfg.eval_every > done // cfg.eval_every:
                row = self.st.steps[-1]
                t = threading.Thread(target=self._guard, args=(self._eval, row["step"], row["checkpoint"],
                                                               row["version"], True), name="async-eval", daemon=True)
                t.start()
                self.evals.append(t)

    def _take(self, need: int) -> list[tuple[str, int]]:
        """The oldest `need` queued groups fresh enough for the newest weights, with their staleness;
        a staler one is dropped on the way. Waits (trainer idle) until there are `need`."""
        st, t0 = self.st, time.monotonic()
        with self.cond:
            while True:
                self._check()
                now = len(st.versions) - 1
                taken: list[tuple[str, int]] = []
                dropped = False
                for gid in sorted((k for k, g in st.groups.items() if g["status"] == "ready"), key=int):
                    g = st.groups[gid]
                    stale = now - min((self._index(v) for v in g["versions"]), default=now)
                    if stale > self.cfg.max_staleness:
                        g.update(status="dropped", staleness=stale)
                        st.totals["dropped_stale"] = st.totals.get("dropped_stale", 0) + 1
                        dropped = True
                    elif len(taken) < need:
                        taken.append((gid, stale))
                if dropped:
                    st.save(self.path)
                if len(taken) == need:
                    st.totals["trainer_idle_s"] = st.totals.get("trainer_idle_s", 0.0) + time.monotonic() - t0
                    return taken
                self.cond.wait(timeout=1.0)

    def _step(self, first: int, n: int, taken: list[tuple[str, int]]) -> None:
        """`n` optimizer steps on the taken groups, from the newest checkpoint; then the push."""
        cfg, st, t0 = self.cfg, self.st, time.monotonic()
        groups = [st.groups[gid] for gid, _ in taken]
        step_dir = cfg.out / f"step-{first}"
        samples = merge_samples([Path(g["samples_dir"]) for g in groups], step_dir / "samples")
        train_cfg = stages.train_config(cfg, step_dir / "samples", st.model, step_dir / "checkpoints", first, n,
                                        max(1, samples // n), stages.partition(cfg, self.s.algo, self.console),
                                        stages.initial_policy(cfg, st), **self.correction)
        stages.write_train_config(step_dir / "train_config.json", train_cfg)
        result = train(train_cfg)
        hit("step")
        row = {"step": first, "steps": n, "from_version": st.versions[-1], "version": result.version,
               "groups": [gid for gid, _ in taken], "group_versions": [g["versions"] for g in groups],
               "staleness": [s for _, s in taken], "samples": samples,
               "tokens": sum(g.get("tokens", 0) for g in groups),
               "reward": sum(g["reward"] for g in groups) / len(groups),
               "success": sum(g["success"] for g in groups) / len(groups),
               "train_log": stages.train_log(result.log_history), "checkpoint": str(result.checkpoint),
               "pushed": False, "seconds": 0.0}
        with st.lock:
            for (gid, stale), g in zip(taken, groups):
                g.update(status="trained", step=first, staleness=stale)
            st.steps.append(row)
            previous, st.model = st.model, str(result.checkpoint)
            st.save(self.path)
        stages.moved_on(cfg, previous)
        hit("push")
        version = push(self.url, result.checkpoint, result.version)
        with st.lock:
            row.update(pushed=True, version=version, seconds=time.monotonic() - t0)
            st.versions.append(version)
            st.totals["train_s"] = st.totals.get("train_s", 0.0) + row["seconds"]
            st.save(self.path)
        st_ = row["staleness"]
        self.console.print(f"step {first}{f'–{first + n - 1}' if n > 1 else ''}: {len(taken)} groups, {samples} samples, "
                           f"staleness {sum(st_) / len(st_):.2f}/{max(st_)}, reward {row['reward']:.3f}, "
                           f"success {row['success']:.3f}, {row['seconds']:.1f} s → {version}")

    def _index(self, version: str | None) -> int:
        """A version's place among those this loop pushed; any other is the weights it started from."""
        return self.st.versions.index(version) if version in self.st.versions else 0

    # -- evaluation, resume, end -----------------------------------------------------------------

    def _eval(self, step: int, checkpoint: str, version: str | None, pinned: bool) -> None:
        """The held-out tasks, greedily: pinned on a second proxy serving `checkpoint` (the local
        backend), else through the loop's proxy, whose version the calls record."""
        cfg, h, tag = self.cfg, self.s.h, f"eval-s{step}-a{self.attempt}"
        if pinned and cfg.upstream is None and h.around is None:
            pc = ProxyConfig(db=self.s.db, backend="local", model=checkpoint, seed=cfg.seed, port=0,
                             host=self.ex.proxy_host)
            with owned_proxy(pc) as p:
                results = stages.rollouts(self.ex, h, p.url, h.eval, 1, tag, 0.0, f"step {step} eval")
        else:
            pinned = False
            results = stages.rollouts(self.ex, h, self.url, h.eval, 1, tag, 0.0, f"step {step} eval")
        _, success, validity = stages.summary(results)
        with self.st.lock:
            self.st.evals.append({"step": step, "version": version, "success": success, "validity": validity,
                                  "metrics": stages.means(results), "pinned": pinned})
            self.st.evals.sort(key=lambda e: e["step"])
            self.st.save(self.path)

    def _resume(self, interrupted: int | None) -> None:
        st = self.st
        if interrupted:
            a = interrupted
            stages.fail_running(self.url, [f"teacher-a{a}", *(f"eval-s{row['step']}-a{a}" for row in st.steps)],
                                f"interrupted: the loop stopped during its attempt {a}")
        for gid, g in st.groups.items():
            if g["status"] == "running":
                stages.fail_running(self.url, [g["tag"]], "interrupted: the loop stopped while its group ran",
                                    finished_too=True)
                g.update(status="failed", why="interrupted")
            elif g["status"] == "rolled":
                self.compile_q.put(gid)
        if st.steps:
            row = st.steps[-1]
            if not row["pushed"] or self.cfg.upstream is not None:  # an upstream may have restarted since
                version = push(self.url, Path(row["checkpoint"]), row["version"])
                if not row["pushed"]:
                    row.update(pushed=True, version=version)
                    st.versions.append(version)
            self.console.print(f"resuming after step {row['step'] + row['steps'] - 1} from {st.model}")
        st.save(self.path)

    def _end_running(self) -> None:
        """The groups still out when training ends are never trained: their rollouts are failed. Run
        again as the loop leaves its proxy, for a rollout a harness thread opened after the first
        pass (a thread cannot be stopped, only kept from starting: `LocalFlight.cancel`)."""
        ended = [g for g in self.st.groups.values() if g["status"] == "running" or g.get("why") == "the loop ended"]
        stages.fail_running(self.url, [g["tag"] for g in ended], "the loop ended before its group did",
                            finished_too=True)
        with self.st.lock:
            for g in ended:
                g.update(status="failed", why="the loop ended")
            self.st.save(self.path)

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - raised again on the trainer's thread
            with self.cond:
                self.failure.append(exc)
                self.cond.notify_all()
            self.stop.set()

    def _check(self) -> None:
        if self.failure:
            raise self.failure[0]

    def _add(self, key: str, seconds: float) -> None:
        with self.st.lock:
            self.st.totals[key] = self.st.totals.get(key, 0.0) + seconds

    def _totals(self) -> None:
        st = self.st
        stale = [s for row in st.steps for s in row["staleness"]]
        status = [g["status"] for g in st.groups.values()]
        with st.lock:
            st.totals.update(steps=sum(row["steps"] for row in st.steps), versions=len(st.versions) - 1,
                             mean_staleness=sum(stale) / len(stale) if stale else 0.0,
                             max_staleness=max(stale, default=0), groups_trained=status.count("trained"),
                             groups_failed=status.count("failed"), groups_unused=sum(s in WAITING for s in status))
            st.totals.setdefault("dropped_stale", 0)
            st.save(self.path)
