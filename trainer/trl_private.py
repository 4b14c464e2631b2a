"""Every private TRL member the trainer relies on, in one place.

The trainer subclasses `trl.GRPOTrainer`. What it overrides or calls below is not TRL's public API
and changes between minor releases (`_get_per_token_logps_and_entropies` returned two values before
TRL 1.7, three since), so pyproject.toml pins the tested range `TESTED` and `drift()` checks the
installed TRL against what the code assumes: `HarnessTrainer` refuses to start on a mismatch, and
`tests/test_trainer_trl_private.py` fails naming the member and the TRL version.

Assumptions on TRL's step structure (checked by the normalisation tests, not here): TRL's
`_prepare_inputs` hands `_generate_and_score_completions` the local rows of `steps_per_generation`
micro-batches at once, then shuffles and splits the returned dict row-wise (`split_tensor_dict`),
so per-row tensors computed there travel with their rows and 0-dim tensors are copied to each part."""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from typing import Any

import torch

TESTED = ">=1.16,<1.17"  # keep equal to the `trl` requirement in pyproject.toml

# Methods overridden by HarnessTrainer and its subclasses: TRL must still call them with these parameters.
OVERRIDDEN = {
    "_generate_and_score_completions": ("inputs",),
    "_compute_loss": ("model", "inputs"),
    "_get_train_sampler": ("dataset",),
}
# Methods called, with the parameters passed by name or position.
CALLED = {
    "_get_per_token_logps_and_entropies": ("model", "input_ids", "attention_mask", "logits_to_keep", "compute_entropy"),
}
# Instance attributes set by GRPOTrainer.__init__ and read (or, `_metrics`, written) by the trainer.
ATTRIBUTES = ("_metrics", "_tokenizer", "beta", "epsilon_low", "epsilon_high", "num_iterations", "ref_model",
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
    for name, params in {**OVERRIDDEN, **CALLED}.items():
        fn = getattr(GRPOTrainer, name, None)
        if not callable(fn):
            problems.append(f"{_where(name)} no longer exists")
            continue
        have = inspect.signature(fn).parameters
        missing = [p for p in params if p not in have]
        if missing:
            problems.append(f"{_where(name)} has no parameter(s) {', '.join(missing)}")
    import trl.trainer.utils as fused

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


def per_token_logps(trainer, model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                    compute_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs, entropies or None) of the last `logits_to_keep` tokens, through TRL's fused head."""
    with _score_only_kept():
        out = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                         compute_entropy=compute_entropy)
    if not (isinstance(out, tuple) and len(out) == 3):
        raise RuntimeError(f"{_where('_get_per_token_logps_and_entropies')} returned {type(out).__name__} of "
                           f"{len(out) if isinstance(out, tuple) else 1} value(s), expected (logps, entropies, aux_loss); "
                           f"harnessrl is tested with trl{TESTED}")
    return out[0], out[1]


def text_tokenizer(trainer):
    """The text tokenizer TRL took from `processing_class`."""
    return trainer._tokenizer


def log_metric(trainer, mode: str, name: str, value: float) -> None:
    """Appended values are averaged by TRL at each logging step."""
    trainer._metrics[mode][name].append(value)
