"""Adam's state carried from one training run to the next.

A loop trains in runs (a round's steps; `--async`: the steps between two pushes), each a trainer
built afresh from the last checkpoint. Without its optimizer state every run would start Adam
again: zero moments, and a first step of about lr per parameter whatever its gradient (bias
correction at step 1 makes the update m/√v = ±1), so a loop pushing after every step would train
with sign-SGD, not Adam. The papers' trainers keep one optimizer for the whole training. So each
checkpoint also holds the optimizer's state (`optimizer.pt`), and a run given it (`--optimizer-state`)
loads it before its first step: moments and step count go on where the last run stopped.

Sharded optimizers (DeepSpeed ZeRO, FSDP) hold their state per process: not carried (a one-line
warning), each run starts its optimizer afresh as before."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import TrainerCallback

from harnessrl.errors import UserError

FILE = "optimizer.pt"
log = logging.getLogger(__name__)


class LoadOptimizerState(TrainerCallback):
    """Loads the state into the trainer's optimizer once it exists, before the first step."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise UserError(f"--optimizer-state {self.path}: no such file (a checkpoint's {FILE})")

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        if _sharded(args):
            log.warning("optimizer state not carried: a sharded optimizer (DeepSpeed or FSDP) starts afresh")
            return
        saved = torch.load(self.path, map_location="cpu", weights_only=True)
        try:
            optimizer.load_state_dict(saved)  # each state tensor goes to its parameter's device
        except (ValueError, KeyError, RuntimeError) as exc:
            raise UserError(f"--optimizer-state {self.path}: not this model's optimizer ({str(exc).splitlines()[0]})") \
                from None


def save(trainer, checkpoint: Path) -> None:
    """The optimizer's state beside the checkpoint's weights (every process holds the same state
    under DDP: the main process writes it)."""
    if _sharded(trainer.args):
        return
    if trainer.accelerator.is_main_process:
        torch.save(trainer.optimizer.state_dict(), checkpoint / FILE)


def _sharded(args) -> bool:
    return bool(getattr(args, "deepspeed", None) or getattr(args, "fsdp", None))
