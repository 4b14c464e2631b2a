"""Sub-commands of the trainer: `train`, `capo-partition`, `vllm`, `sft`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from harnessrl.console import Console

from harnessrl.cli_options import from_config
from harnessrl.trainer.config import TrainConfig


def register(app: typer.Typer) -> None:
    """Add this part's commands to the main app."""

    @app.command("train")
    @from_config(TrainConfig, unset_is_none=True)
    def train(
        flags: dict,
        samples: Path = typer.Argument(..., help="Directory written by `harnessrl compile` (samples.parquet)."),
        config: Optional[Path] = typer.Option(None, "--config", help="YAML file with any of these options."),
    ) -> None:
        """Train the policy on compiled samples with TRL (docs/methods.md §6) and optionally push the weights."""
        from harnessrl.trainer.config import load_config
        from harnessrl.trainer.run import train as run_train

        cfg = load_config(config, {**flags, "samples": str(samples)})
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
        rho: float = typer.Option(0.25, "--rho", help="Fraction of each layer's MLP units and attention heads in each "
                                  "partition (rules activation, contrast), or of the layers (layers, layers_contrast)."),
        units: str = typer.Option("heads_mlp", "--units", help="heads_mlp (attention heads and MLP units) | mlp (MLP units only)."),
        by: str = typer.Option("activation", "--by", help="layers (whole layers by layer-wise importance, the paper's) | "
                               "layers_contrast | activation (top units of every layer; a departure) | contrast "
                               "(by a_act − a_args). `train --capo-rule` takes the same."),
        threshold: Optional[float] = typer.Option(None, "--threshold", help="Probe rollouts with outcome ≥ this (default: group best and > 0)."),
    ) -> None:
        """Compute CAPO's action/args partitions (attention heads and MLP units) and the layer-wise importance plot."""
        from rich.table import Table

        from harnessrl.trainer.capo_partition import build_partition, write_outputs
        from harnessrl.trainer.data import load_samples
        from harnessrl.trainer.run import load_model

        data = load_samples(samples)
        m, _ = load_model(model)
        part, report = build_partition(m, data.samples, rho=rho, by=by, threshold=threshold, units=units)
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
        host: str = typer.Option("127.0.0.1", "--host", help="Address vLLM listens on."),
        port: int = typer.Option(8001, "--port", help="Port vLLM listens on."),
        lora: bool = typer.Option(False, "--lora", help="Serve LoRA adapters loaded at run time (else full-weight reload)."),
        max_lora_rank: int = typer.Option(64, "--max-lora-rank", help="Largest LoRA rank vLLM accepts (--lora)."),
        vllm_bin: Optional[str] = typer.Option(None, "--vllm-bin", help="The vllm executable of its own environment."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the command instead of running it."),
    ) -> None:
        """Start vLLM from its own environment with the flags harnessrl needs; extra args go to `vllm serve`."""
        from harnessrl.errors import UserError
        from harnessrl.trainer.vllm import check_tools_rendered, find_vllm, run_vllm, serve_command

        check_tools_rendered(model, list(ctx.args))
        try:
            binary = vllm_bin if dry_run and vllm_bin else find_vllm(vllm_bin)
        except UserError:
            if not dry_run:
                raise
            binary = "vllm"  # a dry run shows the command without vLLM installed here: `vllm` from the PATH
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
        lr: float = typer.Option(3e-3, "--lr", help="Learning rate."),
        call_weight: float = typer.Option(1.0, "--call-weight", help="Loss weight of complete tool-call spans."),
        seed: int = typer.Option(0, "--seed", help="Seed of the data order and sampling."),
    ) -> None:
        """Supervised warm start on expert traces (targets: the expert's reasoning, tool calls and answers)."""
        from harnessrl.trainer.sft import SftConfig, sft

        path = sft(SftConfig(tasks=str(tasks), model=model, out=str(out), steps=steps, batch_size=batch_size, lr=lr,
                             call_weight=call_weight, seed=seed))
        Console().print(f"fine-tuned model written to [bold]{path}[/bold]")
