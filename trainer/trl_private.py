"""Every private TRL member the trainer relies on, in one place.

The trainer subclasses `trl.GRPOTrainer`. What it overrides or calls below is not TRL's public API
and changes between minor releases (`_get_per_token_logps_and_entropies` returned two values before
TRL 1.7, three since), so pyproject.toml pins the tested range `TESTED` and `drift()` checks the
installed TRL against what the code assumes: `HarnessTrainer` refuses to start on a mismatch, and
`tests/test_trainer_trl_private.py` fails naming the member and the TRL version.

Assumptions on TRL's step structure (checked by the normalisation tests, not here): TRL's
`training_step` calls `_prepare_inputs` once per micro-batch and then counts it in `_step`, so
`_step` divided by the accumulation steps is the optimizer step and its remainder the micro-batch;
`_prepare_inputs` (overridden) returns the micro-batch `_compute_loss` gets. The model's forward
takes `fused_lm_head=True` (TRL's `add_fused_lm_head`, put on the model in GRPOTrainer.__init__)
and then returns per-position `log_probs` and `entropy` computed in chunks."""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from typing import Any

import torch

TESTED = ">=1.16,<1.17"  # keep equal to the `trl` requirement in pyproject.toml

# Methods overridden by HarnessTrainer and its subclasses: TRL must still call them with these parameters.
OVERRIDDEN = {
    "_prepare_inputs": ("generation_batch",),
    "_compute_loss": ("model", "inputs"),
    "_get_train_sampler": ("dataset",),
}
# Instance attributes set by GRPOTrainer.__init__ and read (or, `_metrics`, written) by the trainer.
ATTRIBUTES = ("_metrics", "_tokenizer", "_step", "beta", "epsilon_low", "epsilon_high", "num_iterations", "ref_model",
              "loss_type")
# Class flags: GRPOTrainer's loss is already scaled for gradient accumulation, so transformers'
# Trainer must not divide it again (our step weights rely on that).
CLASS_FLAGS = {"loss_is_scaled_for_ga": True}


def trl_version() -> str:
    import trl

    return trl.__version__


def _where(name: str) -> str:
    return f"trl {trl_version()}: GRPOTrainer.{name}"


def drift(trainer: Any = None, base: type | None = None) -> list[str]:
    """One line per private member that no longer matches (empty when all do). With a constructed
    trainer the instance attributes are checked too. `base`: the class to check (default GRPOTrainer)."""
    from trl import GRPOTrainer

    GRPOTrainer = base or GRPOTrainer  # noqa: N806
    problems = []
    for name, params in OVERRIDDEN.items():
        fn = getattr(GRPOTrainer, name, None)
        if not callable(fn):
            problems.append(f"{_where(name)} no longer exists")
            continue
        have = inspect.signature(fn).parameters
        missing = [p for p in params if p not in have]
        if missing:
            problems.append(f"{_where(name)} has no parameter(s) {', '.join(missing)}")
    import trl.trainer.utils as fused

    if "outputs" not in inspect.signature(getattr(fused, "add_fused_lm_head", lambda: None)).parameters:
        problems.append(f"trl {trl_version()}: trl.trainer.utils.add_fused_lm_head (the fused log-prob head) changed or is gone")
    if not callable(getattr(fused, "_use_triton", None)):
        problems.append(f"trl {trl_version()}: trl.trainer.utils._use_triton (the fused head's compact switch) no longer exists")
    for name, value in CLASS_FLAGS.items():
        if getattr(GRPOTrainer, name, None) != value:
            problems.append(f"{_where(name)} is {getattr(GRPOTrainer, name, None)!r}, expected {value!r}")
    if trainer is not None:
        problems += [f"{_where(name)} (instance attribute) is not set" for name in ATTRIBUTES if not hasattr(trainer, name)]
    return problems


@contextmanager
def _score_only_kept():
    """TRL's fused head scores only the positions whose label counts (the last `logits_to_keep`,
    not padding) on Triton devices, and every position elsewhere (fixed tile shapes for compilers).
    On CPU the shapes need not be fixed, and scoring the prompt too is most of a step's head cost:
    take the Triton devices' path. Same kernel, same values, only on fewer rows."""
    import trl.trainer.utils as fused

    choose = fused._use_triton
    fused._use_triton = lambda device: device.type == "cpu" or choose(device)
    try:
        yield
    finally:
        fused._use_triton = choose


def fused_logps(trainer, model, compute_entropy: bool, **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs, entropies or None) at every position of `inputs["labels"]` (shifted by one), through the
    fused head TRL puts on the model (`add_fused_lm_head`: chunks of tokens × vocabulary, never whole logits)."""
    with _score_only_kept(), trainer.accelerator.autocast():
        out = model(**inputs, fused_lm_head=True)
    logps = getattr(out, "log_probs", None)
    if logps is None:
        raise RuntimeError(f"trl {trl_version()}: the model's forward(fused_lm_head=True) returned no log_probs "
                           f"(trl.trainer.utils.add_fused_lm_head changed); harnessrl is tested with trl{TESTED}")
    return logps, (out.entropy if compute_entropy else None)


@contextmanager
def reference_from(model, path: str | None):
    """GRPOTrainer.__init__ builds its KL reference model by loading `model.config._name_or_path`
    (`get_config_model_id`), then prepares it as the policy (dtype, fused head, dropout off,
    DeepSpeed/FSDP): pointing that name at `path` for the duration of the call gives a reference
    loaded from `path` with all of that (`ref_model`: the loop's initial policy in every round)."""
    if path is None:
        yield
        return
    name = model.config._name_or_path
    model.config._name_or_path = str(path)
    try:
        yield
    finally:
        model.config._name_or_path = name


def text_tokenizer(trainer):
    """The text tokenizer TRL took from `processing_class`."""
    return trainer._tokenizer


def step_counter(trainer) -> int:
    """Micro-batches trained so far (TRL's training_step counts them)."""
    return trainer._step


def log_metric(trainer, mode: str, name: str, value: float) -> None:
    """Appended values are averaged by TRL at each logging step."""
    trainer._metrics[mode][name].append(value)
