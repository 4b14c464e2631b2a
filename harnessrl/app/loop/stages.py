"""The loop's stages, shared by the round driver (`sync.py`) and the asynchronous one
(`async_driver.py`): setting up the harness, running a batch of rollouts, compiling a run tag,
the trainer's options, the proxy, the teacher warm-up and the metrics of a batch."""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.algorithms import Algorithm, get_algorithm, process_rewards
from harnessrl.app.loop.config import LoopConfig, Teacher
from harnessrl.app.loop.state import LoopState
from harnessrl.app.rollouts.executors import Executor, run_batch
from harnessrl.app.rollouts.harnesses import HarnessTasks, TaskSource, load_harness
from harnessrl.app.rollouts.jobs import counted, jobs_for, settle
from harnessrl.app.rollouts.run_cmd import owned_proxy  # a key only this process holds (rollouts get their own)
from harnessrl.compiler.expert_traces import collect, write_db, write_jsonl
from harnessrl.compiler.pipeline import PROCESS_REWARDS, CompileOptions, Compiler
from harnessrl.compiler.tasks import import_tasks
from harnessrl.console import Console
from harnessrl.errors import UserError
from harnessrl.proxy.server import ProxyConfig
from harnessrl.trainer.config import TrainConfig, load_config
from harnessrl.trainer.optimizer_state import FILE as OPTIMIZER_STATE
from harnessrl.trainer.sft import SftConfig, sft

DEFAULT_DEADLINE = 3600.0  # the executor's backstop when no per-rollout timeout is given: a hung rollout ends the wait
DEADLINE_GRACE = 120.0  # beyond --cmd's timeouts: workspace, kills, reporting


@dataclass
class Setup:
    h: HarnessTasks
    algo: Algorithm
    db: str


def prepare(cfg: LoopConfig) -> Setup:
    """Check the options, load the harness and its tasks (into the DB, for compile-time rewards and
    PACT) before any rollout, so that a mistake fails now."""
    algo = get_algorithm(cfg.algo)
    if cfg.async_:
        _check_async(cfg)
    unknown = [p for p in process_rewards(algo, cfg.process) if p not in PROCESS_REWARDS]
    if unknown:
        raise UserError(f"--process {unknown[0]!r}: use {', '.join(PROCESS_REWARDS)} or none")
    if not (Path(cfg.model) / "config.json").is_file():
        raise UserError(f"--model {cfg.model}: not a model directory (no config.json)")
    cfg.out.mkdir(parents=True, exist_ok=True)
    db = cfg.db or str(cfg.out / "runs.db")
    src = TaskSource(cfg.tasks, cfg.corpus, cfg.out, cfg.n_tasks, cfg.eval_fraction, cfg.seed)
    if bool(cfg.cmd) == bool(cfg.harness):
        raise UserError("give either --harness NAME or --cmd \"PROGRAM ... {task}\"")
    if cfg.intercept and cfg.executor != "local":
        raise UserError("--intercept runs one mitmdump on this machine: use it with --executor local")
    if cfg.cmd:
        from harnessrl.app.rollouts.cmd_harness import cmd_harness
        from harnessrl.app.sandbox.run import db_files

        h = cmd_harness(cfg.cmd, src, cfg.reward_from, cfg.intercept, cfg.cmd_flags, hidden=db_files(db))
    else:
        h = load_harness(cfg.harness, src)
    if not h.train:
        raise UserError("no training tasks: give more tasks or a smaller --eval-fraction")
    if h.tasks_file:
        import_tasks(db, h.tasks_file)  # references and expert traces for compile-time rewards and PACT
    # a bad --train-config fails now, not after the first rollouts (CAPO's partition is made later)
    train_config(cfg, cfg.out, cfg.model, cfg.out, 0, cfg.steps, cfg.batch_size, cfg.partition or "made from data",
                 cfg.model)
    return Setup(h, algo, db)


def _check_async(cfg: LoopConfig) -> None:
    if cfg.groups_per_step < 1 or cfg.push_every < 1 or cfg.max_staleness < 0 or cfg.eval_every < 0:
        raise UserError("--groups-per-step and --push-every must be at least 1, --max-staleness and --eval-every "
                        "at least 0")
    if cfg.max_queued_steps < cfg.push_every:
        raise UserError(f"--max-queued-steps {cfg.max_queued_steps}: at least --push-every ({cfg.push_every}), "
                        "or the trainer would wait for groups the producer holds back")


def deadline(cfg: LoopConfig) -> float:
    """The executor's backstop: above what `--cmd`'s `--timeout` allows a rollout (the command,
    then its hidden tests, each under that timeout), else DEFAULT_DEADLINE."""
    if cfg.rollout_deadline is not None:
        return cfg.rollout_deadline
    if cfg.cmd and cfg.cmd_flags.timeout:
        return 2 * cfg.cmd_flags.timeout + DEADLINE_GRACE
    return DEFAULT_DEADLINE


def rollouts(ex: Executor, h: HarnessTasks, url: str, tasks: list[Any], group: int, run_tag: str,
             temperature: float, label: str, seconds: list[float] | None = None) -> list[Any]:
    """`group` rollouts of every task on the executor; then the run tag's rollouts that no result
    counts (an attempt redone, given up, lost with its node) are finished as failed."""
    results = run_batch(ex, h.run, url, jobs_for(h, tasks, group, run_tag, temperature), label, seconds)
    settle(url, run_tag, results)
    return results


def compile_run(cfg: LoopConfig, s: Setup, tag: str, out: Path, results: list[Any]) -> dict[str, Any]:
    """Exactly the counted rollouts (where the results name them) of run tag `tag`, into `out`."""
    return Compiler(s.db, CompileOptions(out=out, advantage=s.algo.advantage, process=process_rewards(s.algo, cfg.process),
                                         train_agents=s.algo.train_agents, run=tag, reward=cfg.reward,
                                         tokenizer=cfg.model, rollouts=counted(results) or ())).run()


def proxy_config(cfg: LoopConfig, db: str, state: LoopState, host: str) -> ProxyConfig:
    """The local backend, or the vLLM upstream in prefix mode (the proxy's own prompt ids, sent
    under the name vLLM serves) through an upstreams file of one URL, so that each push drains it
    and reloads it from the checkpoint directory (proxy/upstream/weight_push.py). It listens on
    `host`: the executor's, an address where the rollouts reach it (a Ray node's, for Ray)."""
    if cfg.upstream is None:
        return ProxyConfig(db=db, backend="local", model=state.model, seed=cfg.seed, port=0, host=host)
    import httpx

    try:  # before any rollout: every call would fail on it
        httpx.get(cfg.upstream.rstrip("/").removesuffix("/v1") + "/v1/models", timeout=30).raise_for_status()
    except httpx.HTTPError as exc:
        raise UserError(f"--upstream {cfg.upstream}: no model list there ({type(exc).__name__}); start vLLM "
                        "with `harnessrl vllm MODEL`") from None
    listing = cfg.out / "upstreams.txt"
    listing.write_text(cfg.upstream + "\n")
    return ProxyConfig(db=db, upstreams_file=str(listing), prefix=True, tokenizer=state.model, seed=cfg.seed, port=0,
                       host=host)


def train_config(cfg: LoopConfig, samples: Path, model: str, out: Path, first_step: int, steps: int, batch_size: int,
                 partition: str | None, ref_model: str, **flags: Any) -> TrainConfig:
    """The trainer's options for `steps` optimizer steps from the loop's step `first_step`:
    --train-config's, under the loop's own flags (`flags` last). PACT's schedules (λ_a, the reasoning
    level) anneal once over the loop's rounds × steps, as over the paper's whole training; the KL
    reference is the initial policy throughout; the optimizer goes on from `model`'s state, where
    the loop wrote one (`--carry-optimizer`)."""
    carried = Path(model) / OPTIMIZER_STATE
    return load_config(cfg.train_config, dict(
        samples=str(samples), model=model, algo=cfg.algo, out=str(out), steps=steps, batch_size=batch_size,
        lr=cfg.lr, seed=cfg.seed + first_step, temperature=cfg.temperature, partition=partition, ref_model=ref_model,
        pact_schedule_start=first_step, pact_schedule_steps=cfg.rounds * cfg.steps,
        optimizer_state=str(carried) if cfg.carry_optimizer and carried.is_file() else None, **flags))


def moved_on(cfg: LoopConfig, old_model: str) -> None:
    """The loop's newest checkpoint carries the optimizer now: the older one's state file, written by
    this loop, goes (it is as large as two copies of the weights); the weights stay."""
    old = Path(old_model).resolve()
    if cfg.out.resolve() in old.parents:
        (old / OPTIMIZER_STATE).unlink(missing_ok=True)


def async_correction(cfg: LoopConfig) -> dict[str, Any]:
    """`loop --async`'s trainer flag: the decoupled objective's behaviour weight on (`tis`, docs/methods.md
    §6.5), unless --train-config chooses the ratio or the weight itself."""
    if cfg.train_config is not None:
        import yaml

        chosen = yaml.safe_load(Path(cfg.train_config).read_text()) or {}
        if isinstance(chosen, dict) and ({"tis", "ratio_to"} & set(chosen)):
            return {}
    return {"tis": True}


def write_train_config(path: Path, train_cfg: TrainConfig) -> None:
    from harnessrl.trainer.config import config_dict

    path.write_text(json.dumps(config_dict(train_cfg), indent=2))


def partition(cfg: LoopConfig, algo: Algorithm, console: Console) -> str | None:
    """The one partition file of an algorithm that routes gradients by a static partition (CAPO:
    the paper's partitions are built once, from a probing set): `--partition`, else
    `<out>/capo_partition.pt`, which the trainer builds from the first samples that hold a
    successful rollout and reuses after; until then each step trains unrouted (trainer/capo_partition.py)."""
    if not algo.partition:
        return cfg.partition
    path = cfg.partition or str(cfg.out / f"{algo.name}_partition.pt")
    if not Path(path).is_file():
        console.print(f"{algo.name}: no partition yet; {path} is built from the first successful rollouts, and until "
                      "then training is unrouted")
    return path


def initial_policy(cfg: LoopConfig, state: LoopState) -> str:
    """The policy RL starts from: the teacher warm-up's checkpoint, else --model. The KL reference of
    every step (PACT's paper keeps it fixed at the initial policy for all of training)."""
    return (state.teacher or {}).get("checkpoint") or cfg.model


def teacher_round(cfg: LoopConfig, ex: Executor, t: Teacher, s: Setup, state: LoopState, tag: str,
                  console: Console) -> dict[str, Any]:
    """The training tasks through the teacher; its best rollouts as traces; SFT on them."""
    teacher = ProxyConfig(db=s.db, upstream=t.url, upstream_api_key=t.key, upstream_dialect=t.dialect,
                          upstream_model=t.model, upstream_ca=t.ca, port=0, host=ex.proxy_host)
    with owned_proxy(teacher) as proxy, (s.h.around(proxy.url) if s.h.around else nullcontext()):
        results = rollouts(ex, s.h, proxy.url, s.h.train, 1, tag, 0.0, "teacher round")
    traces, stats = collect(s.db, run=tag, min_reward=t.min_reward)
    write_db(s.db, traces)
    traces_file = cfg.out / "teacher_traces.jsonl"
    write_jsonl(traces, traces_file)
    console.print(f"teacher round: success {summary(results)[1]:.3f}; {stats.line()}")
    out = {"run": tag, "success": summary(results)[1], "traces": len(traces), "checkpoint": None}
    if traces and t.sft_steps:
        warm = sft(SftConfig(tasks=str(traces_file), model=state.model, out=str(cfg.out / "teacher-warm"),
                             steps=t.sft_steps, seed=cfg.seed))
        state.model = out["checkpoint"] = str(warm)
    return out


def fail_running(url: str, tags: list[str], why: str, finished_too: bool = False) -> int:
    """Finish as failed the rollouts still running under these run tags (a killed loop's): they
    never count, and a straggler's calls to them are refused. `finished_too`: the finished ones as
    well (a group that will never be complete: its finished rollouts would make a short group for
    any later compile of the DB)."""
    from harnessrl.app.rollouts.run_cmd import proxy_key
    from harnessrl.client import HarnessRL

    n = 0
    with HarnessRL(url, api_key=proxy_key()) as client:
        for tag in tags:
            for ro in client.list_rollouts(run=tag):
                if ro["status"] == "running" or (finished_too and ro["status"] == "finished"):
                    client.finish(ro["id"], error=why)
                    n += 1
    return n


def summary(results: list[Any]) -> tuple[float, float, float]:
    """Mean reward and tool-call validity of the rollouts that ran to their end (a failed one has
    an error and no reward: it is not a 0), and success over all of them (a failed one did not
    succeed: leaving it out would make a policy that crashes look better)."""
    success = sum(r.metrics.get("success", 0.0) for r in results if not r.error) / len(results) if results else 0.0
    results = [r for r in results if not r.error]
    if not results:
        return 0.0, success, 0.0
    reward = sum(r.outcome for r in results) / len(results)
    calls = sum(r.metrics.get("tool_calls", 0) for r in results)
    errors = sum(r.metrics.get("tool_errors", 0) for r in results)
    return reward, success, (calls - errors) / calls if calls else 0.0


def group_success(results: list[Any]) -> float:
    """The fraction of the batch's groups (one per training task) with at least one success."""
    groups: dict[str, bool] = {}
    for r in results:
        groups[r.task_id] = groups.get(r.task_id, False) or r.metrics.get("success", 0.0) > 0
    return sum(groups.values()) / len(groups) if groups else 0.0


def train_log(history: list[dict]) -> dict[str, float]:
    """Each numeric metric the trainer logged (loss, grad norms kept and withheld, KL, clip ratio, …),
    averaged over the logged steps, a maximum (`…_max`) the largest; the run's closing summary
    (train_runtime, …) is not a step."""
    values: dict[str, list[float]] = {}
    for entry in history:
        if "train_runtime" in entry:
            continue
        for k, v in entry.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "epoch"):
                values.setdefault(k, []).append(float(v))
    return {k: max(v) if k.endswith("_max") else sum(v) / len(v) for k, v in values.items()}


def means(results: list[Any]) -> dict[str, float]:
    """Each metric the harness reported, averaged over the rollouts that report it."""
    values: dict[str, list[float]] = {}
    for r in results:
        for k, v in getattr(r, "metrics", {}).items():
            if isinstance(v, (int, float)):
                values.setdefault(k, []).append(float(v))
    return {k: sum(v) / len(v) for k, v in sorted(values.items())}
