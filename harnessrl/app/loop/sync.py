"""`harnessrl loop`: rounds of rollouts → compile → train → push → evaluate.

Each round runs K rollouts per training task through the proxy (tagged `run=round-<r>-a<attempt>`),
compiles exactly that run, trains the chosen objective on it, pushes the checkpoint into the
proxy's local backend and evaluates the held-out tasks greedily (`run=eval-<r>-a<attempt>`).
The round state lives in `<out>/loop_state.json` and is written after every finished round, so
a crashed loop resumes at the round it was in: the new attempt gets a fresh run tag, and the
interrupted attempt's rollouts are finished as failed and never compiled.

Rollouts run on an executor (`executors.py`): threads here (`--executor local`, `--concurrency`
at a time) or Ray tasks on a cluster's nodes (`--executor ray`). After each batch the rollouts of
its run tag that the batch did not count are finished as failed, and compile reads exactly the
counted ones: one per task and sample, however often an attempt was redone.

With a teacher (`--teacher URL`), a warm-up round comes first: the same harness on the training
tasks through a proxy whose upstream is the teacher (`run=teacher-a<attempt>`), its best rollouts
taken as expert traces (into the DB, where compile gives them to PACT, and into
`<out>/teacher_traces.jsonl`), and the policy warmed up on them with SFT before round 0.
"""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table
from transformers.utils import logging as hf_logging

from harnessrl.algorithms import get_algorithm, process_rewards
from harnessrl.app.rollouts.executors import Executor, counted, jobs_for, open_executor, settle
from harnessrl.app.rollouts.harnesses import HarnessTasks, TaskSource, load_harness
from harnessrl.app.loop.config import LoopConfig, Teacher
from harnessrl.app.rollouts.run_cmd import owned_proxy  # a key only this process holds (rollouts get their own)
from harnessrl.compiler.expert_traces import collect, write_db, write_jsonl
from harnessrl.compiler.pipeline import PROCESS_REWARDS, CompileOptions, Compiler
from harnessrl.compiler.tasks import import_tasks
from harnessrl.console import Console
from harnessrl.errors import UserError
from harnessrl.proxy.server import ProxyConfig
from harnessrl.trainer.config import TrainConfig, config_dict, load_config
from harnessrl.trainer.push import push
from harnessrl.trainer.run import train
from harnessrl.trainer.sft import SftConfig, sft


DEFAULT_DEADLINE = 3600.0  # the executor's backstop when no per-rollout timeout is given: a hung rollout ends the wait
DEADLINE_GRACE = 120.0  # beyond --cmd's timeouts: workspace, kills, reporting


@dataclass
class RoundRow:
    round: int
    train_reward: float
    train_success: float
    tool_validity: float
    eval_success: float
    tokens: int
    samples: int
    seconds: float
    version: str
    checkpoint: str
    eval_validity: float = 0.0  # tool-call validity on the held-out tasks
    eval_metrics: dict[str, float] = field(default_factory=dict)  # means of the harness's metrics, held out
    failed: int = 0  # training rollouts that failed (crash, timeout, lost node): in no mean, never a 0 reward
    group_success: float = 0.0  # training groups (tasks) with at least one success: those an outcome reward can rank
    train_log: dict[str, float] = field(default_factory=dict)  # the trainer's logged metrics, means over the round's steps


@dataclass
class LoopState:
    model: str  # the checkpoint the next round starts from
    attempts: int = 0
    initial_eval: float | None = None
    teacher: dict[str, Any] | None = None  # the finished warm-up round: run tag, traces, checkpoint
    initial_validity: float | None = None  # held-out tool-call validity at the start
    initial_metrics: dict[str, float] | None = None  # held-out means of the harness's metrics at the start
    rounds: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path, model: str) -> LoopState:
        if path.exists():
            return cls(**json.loads(path.read_text()))
        return cls(model=model)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)  # atomic: a crash leaves the old state or the new one


def _summary(results: list[Any]) -> tuple[float, float, float]:
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


def _group_success(results: list[Any]) -> float:
    """The fraction of the round's groups (one per training task) with at least one success."""
    groups: dict[str, bool] = {}
    for r in results:
        groups[r.task_id] = groups.get(r.task_id, False) or r.metrics.get("success", 0.0) > 0
    return sum(groups.values()) / len(groups) if groups else 0.0


def _train_log(history: list[dict]) -> dict[str, float]:
    """Each numeric metric the trainer logged (loss, grad norms kept and withheld, KL, clip ratio, …),
    averaged over the logged steps; the run's closing summary (train_runtime, …) is not a step."""
    values: dict[str, list[float]] = {}
    for entry in history:
        if "train_runtime" in entry:
            continue
        for k, v in entry.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "epoch"):
                values.setdefault(k, []).append(float(v))
    return {k: sum(v) / len(v) for k, v in values.items()}


def _means(results: list[Any]) -> dict[str, float]:
    """Each metric the harness reported, averaged over the rollouts that report it."""
    values: dict[str, list[float]] = {}
    for r in results:
        for k, v in getattr(r, "metrics", {}).items():
            if isinstance(v, (int, float)):
                values.setdefault(k, []).append(float(v))
    return {k: sum(v) / len(v) for k, v in sorted(values.items())}


def _rollouts(ex: Executor, h: HarnessTasks, url: str, tasks: list[Any], group: int, run_tag: str,
              temperature: float, label: str) -> list[Any]:
    """`group` rollouts of every task on the executor; then the run tag's rollouts that no result
    counts (an attempt redone, given up, lost with its node) are finished as failed."""
    results = ex.map(h.run, url, jobs_for(h, tasks, group, run_tag, temperature), label)
    settle(url, run_tag, results)
    return results


def _deadline(cfg: LoopConfig) -> float:
    """The executor's backstop: above what `--cmd`'s `--timeout` allows a rollout (the command,
    then its hidden tests, each under that timeout), else DEFAULT_DEADLINE."""
    if cfg.rollout_deadline is not None:
        return cfg.rollout_deadline
    if cfg.cmd and cfg.cmd_flags.timeout:
        return 2 * cfg.cmd_flags.timeout + DEADLINE_GRACE
    return DEFAULT_DEADLINE


def run_loop(cfg: LoopConfig, console: Console | None = None) -> LoopState:
    hf_logging.disable_progress_bar()  # per-round weight loading/saving bars would drown the round table
    console = console or Console()
    algo = get_algorithm(cfg.algo)
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
    # a bad --train-config fails now, not after the first round's rollouts (CAPO's partition is made later)
    _train_config(cfg, cfg.out, cfg.model, cfg.out, 0, cfg.partition or "made from round data", cfg.model)
    state_path = cfg.out / "loop_state.json"
    state = LoopState.load(state_path, cfg.model)
    interrupted = state.attempts if state_path.exists() else None  # the attempt a killed loop was in
    if state.rounds:
        console.print(f"resuming after round {state.rounds[-1]['round']} from {state.model}")
    with open_executor(cfg.executor, cfg.concurrency, _deadline(cfg), cfg.ray_address) as ex:
        _run_rounds(cfg, ex, h, algo, db, state, state_path, interrupted, console)
    plot_curves(state, cfg.out / "curves.png")
    return state


def _run_rounds(cfg: LoopConfig, ex: Executor, h: HarnessTasks, algo: Any, db: str, state: LoopState,
                state_path: Path, interrupted: int | None, console: Console) -> None:
    if cfg.teacher is not None and state.teacher is None:
        state.attempts += 1
        state.save(state_path)
        state.teacher = _teacher_round(cfg, ex, cfg.teacher, h, db, state, f"teacher-a{state.attempts}", console)
        state.save(state_path)
    with owned_proxy(_proxy_config(cfg, db, state, ex.proxy_host)) as proxy, \
            (h.around(proxy.url) if h.around else nullcontext()):
        if interrupted:
            _fail_interrupted(proxy.url, len(state.rounds), interrupted)
        if cfg.upstream is not None and state.rounds:
            # resumed: the upstream may serve an older model (restarted since); the local backend
            # starts on state.model itself
            push(proxy.url, Path(state.model), state.rounds[-1]["version"])
        if state.initial_eval is None:
            results = _rollouts(ex, h, proxy.url, h.eval, 1, "eval-initial", 0.0, "eval (start)")
            _, state.initial_eval, state.initial_validity = _summary(results)
            state.initial_metrics = _means(results)
            state.save(state_path)
        for r in range(len(state.rounds), cfg.rounds):
            started = time.perf_counter()
            state.attempts += 1
            state.save(state_path)
            tag = f"round-{r}-a{state.attempts}"
            results = _rollouts(ex, h, proxy.url, h.train, cfg.group, tag, cfg.temperature, f"round {r} rollouts")
            reward, success, validity = _summary(results)
            samples_dir = cfg.out / tag / "samples"
            # exactly the counted rollouts (where the results name them), of this run tag only
            stats = Compiler(db, CompileOptions(out=samples_dir, advantage=algo.advantage,
                                                process=process_rewards(algo, cfg.process),
                                                train_agents=algo.train_agents, run=tag, reward=cfg.reward,
                                                tokenizer=cfg.model, rollouts=counted(results) or ())).run()
            totals = stats["totals"]
            partition = _partition(cfg, console)
            train_cfg = _train_config(cfg, samples_dir, state.model, cfg.out / tag / "checkpoints", r, partition,
                                      _initial_policy(cfg, state))
            (cfg.out / tag / "train_config.json").write_text(json.dumps(config_dict(train_cfg), indent=2))
            result = train(train_cfg)
            version = push(proxy.url, result.checkpoint, result.version)
            held = _rollouts(ex, h, proxy.url, h.eval, 1, f"eval-{r}-a{state.attempts}", 0.0, f"round {r} eval")
            _, held_success, held_validity = _summary(held)
            row = RoundRow(r, reward, success, validity, held_success, int(totals.get("tokens_recorded", 0)),
                           int(totals.get("samples", 0)), time.perf_counter() - started, version,
                           str(result.checkpoint), held_validity, _means(held), sum(1 for x in results if x.error),
                           _group_success(results), _train_log(result.log_history))
            state.rounds.append(asdict(row))
            state.model = str(result.checkpoint)
            state.save(state_path)
            console.print(round_table(state))


def _fail_interrupted(url: str, r: int, attempt: int) -> None:
    """The rollouts a killed attempt left running (its round's, its eval's, a teacher round's) are
    finished as failed: they never count, and a straggler's calls to them are refused."""
    from harnessrl.app.rollouts.run_cmd import proxy_key
    from harnessrl.client import HarnessRL

    with HarnessRL(url, api_key=proxy_key()) as client:
        for tag in (f"round-{r}-a{attempt}", f"eval-{r}-a{attempt}", f"teacher-a{attempt}"):
            for ro in client.list_rollouts(run=tag):
                if ro["status"] == "running":
                    client.finish(ro["id"], error=f"interrupted: the loop stopped during its attempt {attempt}, "
                                                  "which was run again")


def _proxy_config(cfg: LoopConfig, db: str, state: LoopState, host: str) -> ProxyConfig:
    """The local backend, or the vLLM upstream in prefix mode (the proxy's own prompt ids, sent
    under the name vLLM serves) through an upstreams file of one URL, so that each round's push
    drains it and reloads it from the checkpoint directory (proxy/upstream/weight_push.py). It listens on
    `host`: the executor's, an address where the rollouts reach it (a Ray node's, for Ray)."""
    if cfg.upstream is None:
        return ProxyConfig(db=db, backend="local", model=state.model, seed=cfg.seed, port=0, host=host)
    import httpx

    try:  # before any rollout: every call of the round would fail on it
        httpx.get(cfg.upstream.rstrip("/").removesuffix("/v1") + "/v1/models", timeout=30).raise_for_status()
    except httpx.HTTPError as exc:
        raise UserError(f"--upstream {cfg.upstream}: no model list there ({type(exc).__name__}); start vLLM "
                        "with `harnessrl vllm MODEL`") from None
    listing = cfg.out / "upstreams.txt"
    listing.write_text(cfg.upstream + "\n")
    return ProxyConfig(db=db, upstreams_file=str(listing), prefix=True, tokenizer=state.model, seed=cfg.seed, port=0,
                       host=host)


def _train_config(cfg: LoopConfig, samples: Path, model: str, out: Path, r: int, partition: str | None,
                  ref_model: str) -> TrainConfig:
    """Round r's trainer options: --train-config's, under the loop's own flags. PACT's schedules (λ_a,
    the reasoning level) anneal once over all rounds, as over the paper's whole training; the KL
    reference is the initial policy in every round."""
    return load_config(cfg.train_config, dict(
        samples=str(samples), model=model, algo=cfg.algo, out=str(out), steps=cfg.steps, batch_size=cfg.batch_size,
        lr=cfg.lr, seed=cfg.seed + r, temperature=cfg.temperature, partition=partition, ref_model=ref_model,
        pact_schedule_start=r * cfg.steps, pact_schedule_steps=cfg.rounds * cfg.steps))


def _teacher_round(cfg: LoopConfig, ex: Executor, t: Teacher, h: HarnessTasks, db: str, state: LoopState, tag: str,
                   console: Console) -> dict[str, Any]:
    """The training tasks through the teacher; its best rollouts as traces; SFT on them."""
    teacher = ProxyConfig(db=db, upstream=t.url, upstream_api_key=t.key, upstream_dialect=t.dialect,
                          upstream_model=t.model, upstream_ca=t.ca, port=0, host=ex.proxy_host)
    with owned_proxy(teacher) as proxy, (h.around(proxy.url) if h.around else nullcontext()):
        results = _rollouts(ex, h, proxy.url, h.train, 1, tag, 0.0, "teacher round")
    traces, stats = collect(db, run=tag, min_reward=t.min_reward)
    write_db(db, traces)
    traces_file = cfg.out / "teacher_traces.jsonl"
    write_jsonl(traces, traces_file)
    console.print(f"teacher round: success {_summary(results)[1]:.3f}; {stats.line()}")
    out = {"run": tag, "success": _summary(results)[1], "traces": len(traces), "checkpoint": None}
    if traces and t.sft_steps:
        warm = sft(SftConfig(tasks=str(traces_file), model=state.model, out=str(cfg.out / "teacher-warm"),
                             steps=t.sft_steps, seed=cfg.seed))
        state.model = out["checkpoint"] = str(warm)
    return out


def _partition(cfg: LoopConfig, console: Console) -> str | None:
    """CAPO's one partition file for the whole loop (the paper's partitions are static, built once
    from a probing set): `--partition`, else `<out>/capo_partition.pt`, which the trainer builds
    from the first round's samples that hold a successful rollout and reuses after; until then
    each round trains unrouted (trainer/capo_partition.py)."""
    if cfg.algo != "capo":
        return cfg.partition
    path = cfg.partition or str(cfg.out / "capo_partition.pt")
    if not Path(path).is_file():
        console.print(f"capo: no partition yet; {path} is built from this round's successful rollouts, or the round "
                      "trains unrouted if it has none")
    return path


def _initial_policy(cfg: LoopConfig, state: LoopState) -> str:
    """The policy RL starts from: the teacher warm-up's checkpoint, else --model. The KL reference of
    every round (PACT's paper keeps it fixed at the initial policy for all of training)."""
    return (state.teacher or {}).get("checkpoint") or cfg.model


def round_table(state: LoopState) -> Table:
    table = Table(title="harnessrl loop")
    for col in ("round", "reward", "success", "tool-call validity", "eval success", "tokens", "samples", "failed",
                "time (s)", "weights"):
        table.add_column(col, justify="right")
    if state.initial_eval is not None:
        table.add_row("start", "", "", "", f"{state.initial_eval:.3f}", "", "", "", "", "base")
    for row in state.rounds:
        table.add_row(str(row["round"]), f"{row['train_reward']:.3f}", f"{row['train_success']:.3f}",
                      f"{row['tool_validity']:.3f}", f"{row['eval_success']:.3f}", str(row["tokens"]),
                      str(row["samples"]), str(row.get("failed", 0)), f"{row['seconds']:.1f}", row["version"])
    return table


def plot_curves(state: LoopState, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [row["round"] for row in state.rounds]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(rounds, [row["train_reward"] for row in state.rounds], marker="o", label="train reward")
    ax.plot(rounds, [row["train_success"] for row in state.rounds], marker="s", label="train success")
    ax.plot(rounds, [row["eval_success"] for row in state.rounds], marker="^", label="held-out success")
    if state.initial_eval is not None:
        ax.axhline(state.initial_eval, color="grey", linestyle=":", label="held-out success at start")
    ax.set_xlabel("round")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
