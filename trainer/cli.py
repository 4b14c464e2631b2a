"""Sub-commands of the trainer: `train`, `capo-partition`, `vllm`, `sft`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from harnessrl.algorithms import algo_help


def register(app: typer.Typer) -> None:
    """Add this part's commands to the main app."""

    @app.command("train")
    def train(
        samples: Path = typer.Argument(..., help="Directory written by `harnessrl compile` (samples.parquet)."),
        model: Optional[str] = typer.Option(None, "--model", help="Model directory (HF checkpoint)."),
        algo: Optional[str] = typer.Option(None, "--algo", help=algo_help()),
        out: Optional[str] = typer.Option(None, "--out", help="Checkpoint directory (one sub-directory per version)."),
        steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps."),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Samples per optimizer step."),
        partition: Optional[str] = typer.Option(None, "--partition", help="CAPO partition file (capo-partition)."),
        lr: Optional[float] = typer.Option(None, "--lr"),
        epsilon: Optional[float] = typer.Option(None, "--epsilon", help="Clip ε (low; high too unless set in the config)."),
        beta: Optional[float] = typer.Option(None, "--beta", help="KL coefficient to the reference model."),
        loss_agg: Optional[str] = typer.Option(
            None, "--loss-agg", help="token_mean | seq_mean | rollout_mean | prompt_mean (default: the algorithm's paper's: "
                                     "rollout_mean for matpo, prompt_mean for pact, token_mean otherwise)."),
        pact_gate: Optional[str] = typer.Option(
            None, "--pact-gate", help="pact: epoch (default: one anchor gate per prompt per pass over the samples, the "
                                      "paper's) | step (redrawn every optimizer step)."),
        pact_level_limits_context: Optional[bool] = typer.Option(
            None, "--pact-level-limits-context/--pact-level-sft-only",
            help="pact: the annealed reasoning-prefix level limits the privileged context too (default, the paper's), "
                 "or only the SFT targets."),
        pact_schedule_start: Optional[int] = typer.Option(
            None, "--pact-schedule-start", help="pact: the step of the whole training this run starts at (λ_a and level annealing; default 0)."),
        pact_schedule_steps: Optional[int] = typer.Option(
            None, "--pact-schedule-steps", help="pact: the annealing horizon S in steps (default: --steps; `loop` sets both over its rounds)."),
        lora: Optional[bool] = typer.Option(None, "--lora/--full", help="Train a LoRA adapter (PEFT)."),
        push: Optional[str] = typer.Option(None, "--push", help="Push the checkpoint to this proxy or vLLM URL."),
        version: Optional[str] = typer.Option(None, "--version", help="Weight version name for the checkpoint."),
        db: Optional[str] = typer.Option(None, "--db", help="Records DB to record a vLLM push's weight version in."),
        report_to: Optional[str] = typer.Option(None, "--report-to", help="TRL/transformers loggers (none, tensorboard, wandb, ...)."),
        max_tokens_per_microbatch: Optional[int] = typer.Option(
            None, "--max-tokens-per-microbatch", help="Tokens a micro-batch packs at most (default: from the free memory)."),
        max_sample_tokens: Optional[int] = typer.Option(
            None, "--max-sample-tokens", help="Truncate longer samples to this many tokens (or skip them: --over-length skip)."),
        over_length: Optional[str] = typer.Option(None, "--over-length", help="truncate | skip (with --max-sample-tokens)"),
        gradient_checkpointing: Optional[bool] = typer.Option(
            None, "--gradient-checkpointing/--no-gradient-checkpointing",
            help="Activation checkpointing (default: on when a sample has 8192 tokens or more)."),
        config: Optional[Path] = typer.Option(None, "--config", help="YAML file with any of these options."),
    ) -> None:
        """Train the policy on compiled samples with TRL (docs/methods.md §6) and optionally push the weights."""
        from harnessrl.trainer.config import load_config
        from harnessrl.trainer.run import train as run_train

        cfg = load_config(config, dict(
            samples=str(samples), model=model, algo=algo, out=out, steps=steps, batch_size=batch_size,
            partition=partition, lr=lr, epsilon=epsilon, beta=beta, loss_agg=loss_agg, lora=lora, push=push,
            version=version, db=db, report_to=report_to, max_tokens_per_microbatch=max_tokens_per_microbatch,
            max_sample_tokens=max_sample_tokens, over_length=over_length, gradient_checkpointing=gradient_checkpointing,
            pact_gate=pact_gate, pact_level_limits_context=pact_level_limits_context,
            pact_schedule_start=pact_schedule_start, pact_schedule_steps=pact_schedule_steps,
        ))
        if not cfg.model:
            from harnessrl.errors import UserError

            raise UserError("--model is required (or `model:` in the config file)")
        result = run_train(cfg)
        console = Console()
        console.print(f"checkpoint [bold]{result.checkpoint}[/bold] (version {result.version})")
        if result.pushed:
            console.print(f"pushed to {cfg.push}")

    @app.command("capo-partition")
    def capo_partition(
        samples: Path = typer.Argument(..., help="Compiled samples directory (the probe set is taken from it)."),
        model: str = typer.Option(..., "--model", help="Model directory."),
        out: Path = typer.Option(Path("partition.pt"), "--out", help="Partition file; .json and .png are written beside it."),
        rho: float = typer.Option(0.25, "--rho", help="Fraction of MLP units per layer in each partition."),
        by: str = typer.Option("activation", "--by", help="activation | contrast (a_act − a_args)"),
        threshold: Optional[float] = typer.Option(None, "--threshold", help="Probe rollouts with outcome ≥ this (default: group best and > 0)."),
    ) -> None:
        """Compute CAPO's action/args MLP-unit partitions and the layer-wise importance plot."""
        from rich.table import Table

        from harnessrl.trainer.capo_partition import build_partition, write_outputs
        from harnessrl.trainer.data import load_samples
        from harnessrl.trainer.run import load_model

        data = load_samples(samples)
        m, _ = load_model(model)
        part, report = build_partition(m, data.samples, rho=rho, by=by, threshold=threshold)
        paths = write_outputs(part, report, out)
        table = Table(title=f"CAPO importance ({report['probe_samples']} probe samples)")
        for col in ("layer", "action", "args", "overlap"):
            table.add_column(col, justify="right")
        for i, (a, b, o) in enumerate(zip(report["importance"]["action"], report["importance"]["args"], report["overlap_per_layer"])):
            table.add_row(str(i), f"{a:.3f}", f"{b:.3f}", f"{o:.2f}")
        console = Console()
        console.print(table)
        console.print("wrote " + ", ".join(str(p) for p in paths))

    @app.command("vllm", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def vllm(
        ctx: typer.Context,
        model: str = typer.Argument(..., help="Model directory or name for `vllm serve`."),
        host: str = typer.Option("127.0.0.1", "--host"),
        port: int = typer.Option(8001, "--port"),
        lora: bool = typer.Option(False, "--lora", help="Serve LoRA adapters loaded at run time (else full-weight reload)."),
        max_lora_rank: int = typer.Option(64, "--max-lora-rank"),
        vllm_bin: Optional[str] = typer.Option(None, "--vllm-bin", help="The vllm executable of its own environment."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the command instead of running it."),
    ) -> None:
        """Start vLLM from its own environment with the flags harnessrl needs; extra args go to `vllm serve`."""
        from harnessrl.trainer.vllm import find_vllm, run_vllm, serve_command

        binary = vllm_bin if dry_run and vllm_bin else find_vllm(vllm_bin)
        cmd, env = serve_command(binary, model, host, port, lora, max_lora_rank, extra=list(ctx.args))
        if dry_run:
            print(" ".join(f"{k}={v}" for k, v in env.items()), " ".join(cmd))
            return
        run_vllm(cmd, env)

    @app.command("sft")
    def sft_cmd(
        tasks: Path = typer.Argument(..., help="Task JSONL with expert traces (the `harnessrl tasks import` format, plus optional `tools`)."),
        model: str = typer.Option(..., "--model", help="Model directory to start from."),
        out: Path = typer.Option(Path("sft-model"), "--out", help="Directory for the fine-tuned model."),
        steps: int = typer.Option(200, "--steps", help="Optimizer steps."),
        batch_size: int = typer.Option(8, "--batch-size", help="Sequences per step."),
        lr: float = typer.Option(3e-3, "--lr"),
        call_weight: float = typer.Option(1.0, "--call-weight", help="Loss weight of complete tool-call spans."),
        seed: int = typer.Option(0, "--seed"),
    ) -> None:
        """Supervised warm start on expert traces (targets: the expert's reasoning, tool calls and answers)."""
        from harnessrl.trainer.sft import SftConfig, sft

        path = sft(SftConfig(tasks=str(tasks), model=model, out=str(out), steps=steps, batch_size=batch_size, lr=lr,
                             call_weight=call_weight, seed=seed))
        Console().print(f"fine-tuned model written to [bold]{path}[/bold]")
