"""`harnessrl loop`: rounds of rollouts → compile → train → push → evaluate (`--async`:
`async_driver.py`, the same stages without the rounds' barriers).

Each round runs K rollouts per training task through the proxy (tagged `run=round-<r>-a<attempt>`),
compiles exactly that run, trains the chosen objective on it, pushes the checkpoint into the
proxy's local backend and evaluates the held-out tasks greedily (`run=eval-<r>-a<attempt>`).
The round state lives in `<out>/loop_state.json` and is written after every finished round, so
a crashed loop resumes at the round it was in: the new attempt gets a fresh run tag, and the
interrupted attempt's rollouts are finished as failed and never compiled.

Rollouts run on an executor (`rollouts/executors.py`): threads here (`--executor local`,
`--concurrency` at a time) or Ray tasks on a cluster's nodes (`--executor ray`). After each batch
the rollouts of its run tag that the batch did not count are finished as failed, and compile reads
exactly the counted ones: one per task and sample, however often an attempt was redone.

With a teacher (`--teacher URL`), a warm-up round comes first: the same harness on the training
tasks through a proxy whose upstream is the teacher (`run=teacher-a<attempt>`), its best rollouts
taken as expert traces (into the DB, where compile gives them to PACT, and into
`<out>/teacher_traces.jsonl`), and the policy warmed up on them with SFT before round 0.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

from transformers.utils import logging as hf_logging

from harnessrl.app.loop import stages
from harnessrl.app.loop.async_driver import AsyncDriver
from harnessrl.app.loop.config import LoopConfig
from harnessrl.app.loop.groups import trainable
from harnessrl.app.loop.report import plot_curves, round_table
from harnessrl.app.loop.state import LoopState, RoundRow
from harnessrl.app.rollouts.executors import Executor, open_executor
from harnessrl.app.rollouts.run_cmd import owned_proxy
from harnessrl.console import Console
from harnessrl.trainer.push import push
from harnessrl.trainer.run import train


def run_loop(cfg: LoopConfig, console: Console | None = None) -> LoopState:
    hf_logging.disable_progress_bar()  # per-round weight loading/saving bars would drown the round table
    console = console or Console()
    s = stages.prepare(cfg)
    state_path = cfg.out / "loop_state.json"
    state = LoopState.load(state_path, cfg.model, "async" if cfg.async_ else "sync")
    interrupted = state.attempts if state_path.exists() else None  # the attempt a killed loop was in
    with open_executor(cfg.executor, cfg.concurrency, stages.deadline(cfg), cfg.ray_address) as ex:
        if cfg.teacher is not None and state.teacher is None:
            state.attempts += 1
            state.save(state_path)
            state.teacher = stages.teacher_round(cfg, ex, cfg.teacher, s, state, f"teacher-a{state.attempts}", console)
            state.save(state_path)
        if cfg.async_:
            AsyncDriver(cfg, ex, s, state, state_path, console).run(interrupted)
        else:
            if state.rounds:
                console.print(f"resuming after round {state.rounds[-1]['round']} from {state.model}")
            _run_rounds(cfg, ex, s, state, state_path, interrupted, console)
    plot_curves(state, cfg.out / "curves.png")
    return state


def _run_rounds(cfg: LoopConfig, ex: Executor, s: stages.Setup, state: LoopState, state_path: Path,
                interrupted: int | None, console: Console) -> None:
    h = s.h
    with owned_proxy(stages.proxy_config(cfg, s.db, state, ex.proxy_host)) as proxy, \
            (h.around(proxy.url) if h.around else nullcontext()):
        if interrupted:
            r, a = len(state.rounds), interrupted
            stages.fail_running(proxy.url, [f"round-{r}-a{a}", f"eval-{r}-a{a}", f"teacher-a{a}"],
                                f"interrupted: the loop stopped during its attempt {a}, which was run again")
        if cfg.upstream is not None and state.rounds:
            # resumed: the upstream may serve an older model (restarted since); the local backend
            # starts on state.model itself
            push(proxy.url, Path(state.model), state.rounds[-1]["version"])
        if state.initial_eval is None:
            results = stages.rollouts(ex, h, proxy.url, h.eval, 1, "eval-initial", 0.0, "eval (start)")
            _, state.initial_eval, state.initial_validity = stages.summary(results)
            state.initial_metrics = stages.means(results)
            state.save(state_path)
        for r in range(len(state.rounds), cfg.rounds):
            started = time.perf_counter()
            state.attempts += 1
            state.save(state_path)
            tag = f"round-{r}-a{state.attempts}"
            seconds: list[float] = []
            results = stages.rollouts(ex, h, proxy.url, h.train, cfg.group, tag, cfg.temperature, f"round {r} rollouts",
                                      seconds)
            reward, success, validity = stages.summary(results)
            samples_dir = cfg.out / tag / "samples"
            totals = stages.compile_run(cfg, s, tag, samples_dir, results)["totals"]
            train_cfg = stages.train_config(cfg, samples_dir, state.model, cfg.out / tag / "checkpoints", r * cfg.steps,
                                            cfg.steps, cfg.batch_size, stages.partition(cfg, s.algo, console),
                                            stages.initial_policy(cfg, state))
            stages.write_train_config(cfg.out / tag / "train_config.json", train_cfg)
            busy = time.perf_counter()
            if trainable(samples_dir):
                result = train(train_cfg)
                version = push(proxy.url, result.checkpoint, result.version)
                checkpoint, log = str(result.checkpoint), result.log_history
            else:  # equal rewards in every group, or no sample: no gradient, the round keeps its weights
                console.print(f"round {r}: no token to train (no sample, or equal rewards in every group): the "
                              "weights stay as they were")
                version, checkpoint, log = state.rounds[-1]["version"] if state.rounds else "base", state.model, []
            busy = time.perf_counter() - busy
            held = stages.rollouts(ex, h, proxy.url, h.eval, 1, f"eval-{r}-a{state.attempts}", 0.0, f"round {r} eval")
            _, held_success, held_validity = stages.summary(held)
            row = RoundRow(r, reward, success, validity, held_success, int(totals.get("tokens_recorded", 0)),
                           int(totals.get("samples", 0)), time.perf_counter() - started, version,
                           checkpoint, held_validity, stages.means(held), sum(1 for x in results if x.error),
                           stages.group_success(results), stages.train_log(log), busy, sum(seconds))
            state.rounds.append(asdict(row))
            _totals(state, cfg.steps)
            previous, state.model = state.model, checkpoint
            state.save(state_path)
            if previous != checkpoint:
                stages.moved_on(cfg, previous)
            console.print(round_table(state))


def _totals(state: LoopState, steps: int) -> None:
    """The same totals as the asynchronous driver's, where a round driver has them: the trainer is
    idle whenever it does not train (rollouts, compile and evaluation wait for each other)."""
    wall = sum(row["seconds"] for row in state.rounds)
    train_s = sum(row["train_s"] for row in state.rounds)
    state.totals = {"steps": len(state.rounds) * steps, "wall_s": wall, "train_s": train_s,
                    "rollout_s": sum(row["rollout_s"] for row in state.rounds), "trainer_idle_s": wall - train_s}
