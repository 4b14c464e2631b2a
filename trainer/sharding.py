"""What `accelerate launch` with a sharded config (FSDP, DeepSpeed ZeRO) needs from the trainer on a
machine without a GPU, and the one-line refusals where a config would not do what it says
(docs/training.md, "Several processes"; tests/test_trainer_sharded.py)."""

from __future__ import annotations

import os
from typing import Any

import torch

from harnessrl.errors import UserError


def _asked(name: str) -> bool:
    return os.environ.get(f"ACCELERATE_USE_{name}", "false").lower() == "true"


def cpu_args(world: int, bf16: bool) -> dict[str, Any]:
    """TrainingArguments for a run without a GPU. accelerate starts gloo data parallelism on CPU only
    when told `use_cpu`, and transformers refuses bf16 without a GPU ("Your setup doesn't support
    bf16/gpu") unless told so too. DeepSpeed instead needs `use_cpu` off (accelerate sets DeepSpeed up
    only then) and its process group's backend named: accelerate names none on CPU, and a run without
    one is a single process."""
    if torch.cuda.is_available():
        return {}
    if _asked("DEEPSPEED") and world > 1:
        return {"ddp_backend": "gloo"}
    return {"use_cpu": True} if world > 1 or bf16 else {}


def check(accelerator, algo: str) -> None:
    """Refuse a sharded config that accelerate did not set up, rather than train plain data parallel
    under its name, and an algorithm that cannot run sharded."""
    kind = accelerator.distributed_type.name
    if _asked("FSDP") and kind != "FSDP":
        raise UserError(f"FSDP needs a GPU: accelerate {_version()} sets FSDP up only on accelerator devices, and here "
                        f"it would train {kind} instead; on CPU use configs/accelerate_ddp.yaml (with --cpu) or "
                        "configs/deepspeed_zero2.yaml")
    if _asked("DEEPSPEED") and kind != "DEEPSPEED":
        raise UserError(f"the accelerate config asks for DeepSpeed but accelerate set up {kind}")
    if algo == "capo" and kind in ("FSDP", "DEEPSPEED"):
        raise UserError(f"capo cannot run under {kind}: it routes each token type's gradient into whole parameters' "
                        ".grad, which FSDP and ZeRO shard; use data parallel (configs/accelerate_ddp.yaml)")


def _version() -> str:
    import accelerate

    return accelerate.__version__
