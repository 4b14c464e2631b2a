"""One training run: samples + model → trainer for the chosen objective → checkpoint → push."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from harnessrl.errors import UserError
from harnessrl.checkpoints import LOAD_LOCK
from harnessrl.trainer.capo import CapoTrainer
from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.data import Dataset, load_samples
from harnessrl.trainer.grpo import HarnessTrainer
from harnessrl.trainer.matpo import MatpoTrainer
from harnessrl.trainer.optimizer_state import LoadOptimizerState
from harnessrl.trainer.optimizer_state import save as save_optimizer_state
from harnessrl.trainer.pact import PactTrainer


@dataclass
class RunResult:
    checkpoint: Path
    version: str
    pushed: bool
    log_history: list[dict]


# The trainer class of every entry of harnessrl.algorithms.ALGORITHMS (a test checks both agree).
TRAINERS = {"grpo": HarnessTrainer, "capo": CapoTrainer, "matpo": MatpoTrainer, "pact": PactTrainer}


def load_model(path: str, bf16: bool = False):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (Path(path) / "config.json").is_file():
        raise UserError(f"--model {path}: not a model directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if bf16 else torch.float32)
    return model, tokenizer


def build_trainer(cfg: TrainConfig, data: Dataset | None = None, callbacks=None):
    data = data or load_samples(cfg.samples)
    peft_config = None
    if cfg.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=cfg.lora_target, task_type="CAUSAL_LM")
    with LOAD_LOCK:  # the policy, and the reference model TRL loads itself
        model, tokenizer = load_model(cfg.model, cfg.bf16)
        return TRAINERS[cfg.algo](model, cfg, data, tokenizer, peft_config=peft_config, callbacks=callbacks)


def write_checkpoint(trainer, out: str, version: str) -> Path:
    """The weights, every step's metrics (the console shows a bar, trainer/progress.py) and the
    optimizer state. A write that fails (a full disk: measured, a real-model loop's 5 GB of
    checkpoints a run filled it, and torch said only "unexpected pos") is one line with the free
    space, and the half-written checkpoint is removed: nothing half-saved to resume or push from."""
    from safetensors import SafetensorError

    from harnessrl.trainer.push import save_checkpoint

    path = Path(out) / version
    if path.exists():  # save_checkpoint refuses it, and it is not ours to remove
        return save_checkpoint(trainer, out, version)
    try:
        save_checkpoint(trainer, out, version)
        if trainer.accelerator.is_main_process:
            (path / "train_log.json").write_text(json.dumps(trainer.state.log_history, indent=1) + "\n")
        save_optimizer_state(trainer, path)
    except (OSError, RuntimeError, SafetensorError) as exc:
        shutil.rmtree(path, ignore_errors=True)
        free = shutil.disk_usage(out).free / 2**20 if Path(out).is_dir() else float("nan")
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"could not write the checkpoint {path} ({why}); {free:.0f} MiB free on its disk") from None
    return path


def train(cfg: TrainConfig) -> RunResult:
    from harnessrl.trainer.push import new_version, push

    trainer = build_trainer(cfg, callbacks=[LoadOptimizerState(cfg.optimizer_state)] if cfg.optimizer_state else None)
    trainer.train()
    from accelerate.utils import broadcast_object_list

    version = cfg.version or broadcast_object_list([new_version(cfg.algo)])[0]  # one name on every rank
    path = write_checkpoint(trainer, cfg.out, version)
    pushed = False
    if cfg.push and trainer.accelerator.is_main_process:
        version = push(cfg.push, path, version, cfg.push_target, lora=cfg.lora, db=cfg.db)
        pushed = True
    return RunResult(path, version, pushed, trainer.state.log_history)
