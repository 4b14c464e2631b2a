"""Training configuration: one dataclass, filled from defaults, then a YAML file, then CLI flags
(each flag defined here, on its field, with its help: `harnessrl.cli_options`).

Every docs/methods.md §6 constant is a field here, never a literal in the objectives."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from harnessrl.algorithms import algo_help, get_algorithm
from harnessrl.cli_options import option
from harnessrl.errors import UserError

LOSS_AGGS = ("token_mean", "seq_mean", "rollout_mean", "prompt_mean")
PACT_GATES = ("epoch", "step")
RATIO_TO = ("round", "step", "behaviour")
TIS_MODES = ("truncate", "mask", "icepop")
TIS_LEVELS = ("token", "sequence")
ICEPOP_BAND = (0.5, 5.0)  # IcePop's [α, β] (Ling team, Ring-1T)
CAPO_UNITS = ("heads_mlp", "mlp")
CAPO_REMAINDERS = ("shared", "leak")
CAPO_RULES = ("activation", "contrast", "layers", "layers_contrast")  # trainer/capo_partition.py RULES, without torch
OVER_LENGTH = ("truncate", "skip")
# the help panels of `harnessrl train` (a flagged field is an option; the others are set in the YAML --config)
TRAINING, LONG, PUSH, CAPO, PACT, LOGGING = "Training", "Long samples", "Push", "CAPO", "PACT", "Logging"
CORRECTION = "Off-policy correction"


@dataclass
class TrainConfig:
    samples: str = ""  # the command's argument
    model: str = option("", panel=TRAINING, help="Model directory (HF checkpoint).")
    algo: str = option("grpo", panel=TRAINING, help=algo_help())
    out: str = option("checkpoints", panel=TRAINING, help="Checkpoint directory (one sub-directory per version).")
    steps: int = option(1, panel=TRAINING, help="Optimizer steps.")
    batch_size: int = option(  # samples per optimizer step, all processes together
        8, panel=TRAINING, help="Samples per optimizer step.")
    # micro-batches per optimizer step and process: at least this many; more when the step's samples
    # do not fit one --max-tokens-per-microbatch (trainer/steps.py)
    grad_accum: int = 1
    max_tokens_per_microbatch: int | None = option(  # None: from the free memory (trainer/budget.py)
        None, panel=LONG, help="Tokens a micro-batch packs at most (default: from the free memory).")
    max_sample_tokens: int | None = option(  # longer samples are truncated or skipped (over_length); None: no limit
        None, panel=LONG, help="Truncate longer samples to this many tokens (or skip them: --over-length skip).")
    over_length: str = option("truncate", panel=LONG, help="truncate | skip (with --max-sample-tokens)")
    # each prefix that a micro-batch's samples share (a group's prompt, a session's history, an agent's
    # system prompt) computed once for all of them (trainer/prefix_tree.py); exact, so on by default
    shared_prefix: bool = option(True, "--shared-prefix/--no-shared-prefix", panel=LONG,
                                 help="Compute each prefix that samples of a micro-batch share once (exact).")
    lr: float = option(1e-6, panel=TRAINING, help="Learning rate.")
    weight_decay: float = 0.0
    # transformers' `optim` (adamw_torch, sgd, ...). Adam moves every parameter by about lr at a round's
    # first steps whatever its gradient; sgd moves each in proportion to it (needs a far larger lr)
    optim: str = "adamw_torch"
    # an earlier checkpoint's optimizer.pt: its moments and step count go on (trainer/optimizer_state.py;
    # the loop passes the last checkpoint's, so rounds and pushes do not restart Adam)
    optimizer_state: str | None = option(None, panel=TRAINING, help="An earlier checkpoint's optimizer.pt to start "
                                         "the optimizer from (Adam's moments and step count carried on).")
    epsilon: float = option(  # ε_lo
        0.2, panel=TRAINING, help="Clip ε (low; high too unless set in the config).")
    epsilon_high: float | None = None  # ε_hi; None = ε_lo
    # KL coefficient; None = 0 (grpo: a choice, its paper has a KL term; capo; matpo: its objective has
    # none) or 0.001 (pact, its paper's)
    beta: float | None = option(
        None, panel=TRAINING, help="KL coefficient to the reference model (default 0, and 0.001 for pact, its "
        "paper's; for grpo 0 is a choice: DeepSeekMath's GRPO has a KL term).")
    # over the whole optimizer step (trainer/normalise.py); None: the algorithm's registry entry (matpo
    # rollout_mean, pact prompt_mean: their papers'; grpo token_mean: a choice, docs/methods.md §6.1)
    loss_agg: str | None = option(
        None, panel=TRAINING, help="token_mean | seq_mean | rollout_mean | prompt_mean (default: rollout_mean for matpo "
        "and prompt_mean for pact, their papers'; token_mean for grpo, a choice: GRPO's paper averages per sequence, "
        "seq_mean). Refused for capo, whose terms are per-class means.")
    temperature: float = 1.0  # the sampling temperature the behaviour log-probs were computed at
    # the behaviour weight π_old/π_behaviour with the recorded sampling log-probs (docs/methods.md §6.5):
    # the asynchronous loop's correction for tokens sampled by older weights, and for the inference
    # engine's numerics at staleness 0. The mismatch metrics (mismatch/kl, mismatch/out_of_band_frac)
    # are logged whether it is on or not
    tis: bool = option(False, "--tis/--no-tis", panel=CORRECTION,
                       help="Weight each token by π_old/π_behaviour, the recorded sampling log-probs (capped or masked).")
    # truncate: min(r, C) (TIS; clamped to [tis_low, C] when tis_low is set); mask: r inside [tis_low, C],
    # 0 outside (MIS; AReaL's behav_imp_weight_cap
    # is its token-level one-sided form); icepop: the token-level two-sided mask, band [0.5, 5] unless set
    tis_mode: str = option("truncate", panel=CORRECTION,
                           help="truncate: min(r, cap) (TIS) | mask: r from tis-low to cap, 0 outside (MIS) | icepop: "
                           "a token mask, band 0.5 to 5 unless set.")
    # token: r_t per token; sequence: r = Π r_t over the sample's trained tokens, one weight for all of them
    tis_level: str = option("token", panel=CORRECTION, help="token | sequence (one weight, the product of the "
                            "token ratios, for all of a sample's tokens).")
    # C: the truncation cap and the band's upper edge; None: 2 (truncate, mask) or 5 (icepop, its paper's)
    tis_cap: float | None = option(None, panel=CORRECTION, help="Cap C and the band's upper edge (default 2; 5 "
                                   "for icepop).")
    # the band's lower edge; None: 0 (truncate: min(r, C), TIS's; mask: one-sided, AReaL's) or 0.5 (icepop).
    # truncate clamps below it (TRL's vllm_importance_sampling_clip_min), mask and icepop drop below it
    tis_low: float | None = option(None, panel=CORRECTION, help="The band's lower edge: truncate clamps up to it, "
                                   "mask and icepop drop below it (default 0; 0.5 for icepop).")
    # logp_old of the ratio (docs/methods.md §6): "round" = the policy at the start of this run (the
    # loop's round) before its first optimizer step, so the ε clip bounds how far the run's steps move
    # each token (PPO's); "behaviour" = the recorded sampling log-probs; "step" = the policy at the
    # start of each optimizer step (TRL's with one iteration: the ratio is 1, the clip inert)
    ratio_to: str = "round"
    # scale of negative advantages (1 = the method's loss). A negative advantage pushes its sampled
    # tokens down and their mass onto tokens nobody sampled (in a tiny policy: invalid tool names);
    # below 1 the round learns mostly from what worked. 0 keeps only positive advantages
    negative_weight: float = 1.0
    seed: int = 0
    lora: bool = option(False, "--lora/--full", panel=TRAINING, help="Train a LoRA adapter (PEFT).")
    lora_r: int = 16
    lora_alpha: int = 32
    lora_target: str = "all-linear"
    report_to: str = option("none", panel=LOGGING,
                            help="TRL/transformers loggers (none, tensorboard, wandb, ...).")
    logging_steps: int = 1
    bf16: bool = False
    gradient_checkpointing: bool | None = option(  # None: on when a sample is longer than budget.LONG_SAMPLE tokens
        None, "--gradient-checkpointing/--no-gradient-checkpointing", panel=LONG,
        help="Activation checkpointing (default: on when a sample has 8192 tokens or more).")
    push: str | None = option(  # proxy URL (local backend) or vLLM URL
        None, panel=PUSH, help="Push the checkpoint to this proxy or vLLM URL.")
    push_target: str = "auto"  # auto | proxy | vllm
    version: str | None = option(  # weight version name for the push; default derived from the out dir
        None, "--weight-version", deprecated=("--version",), panel=PUSH, help="Weight version name for the checkpoint.")
    # the records DB (its weight-version table) that a vLLM push is recorded in, as the proxy records its own
    db: str | None = option(None, panel=PUSH, help="Records DB to record a vLLM push's weight version in.")
    # capo (§6.2)
    partition: str | None = option(None, panel=CAPO, help="CAPO partition file: loaded if it exists, else made from "
                                   "this run's successful rollouts and saved there (or by capo-partition).")
    # file absent: made from this run's successful rollouts and saved there; no success: an unrouted run
    capo_partition_refresh: bool = False  # rebuild the partition even when the file exists
    # how a partition is built from the probe statistics (docs/methods.md §6.2 step 3; trainer/capo_partition.py
    # RULES). None: activation when this run builds one, and a loaded file's own rule is taken as it is;
    # set, a loaded file made by another rule is refused
    capo_rule: str | None = option(
        None, panel=CAPO, help="CAPO partition rule: layers (whole layers by layer-wise importance, the paper's) | "
        "layers_contrast | activation (top units of every layer, the default: a departure) | contrast.")
    capo_rho: float = 0.25  # share of each layer's units and heads (activation, contrast) or of the layers (layers rules)
    capo_units: str = "heads_mlp"  # heads_mlp: attention heads and MLP units of every layer; mlp: MLP units only
    # shared: parameters in neither partition get both types' gradient; leak: they get γ of each (the earlier rule)
    capo_remainder: str = "shared"
    # leak of each type's gradient into the other type's partition. 0: bench/capo_gamma.py measures each
    # type keeping ≥ 93 % of its layer gradient norm at γ = 0 (ρ 0.1–0.5, shared remainder): the
    # strongest separation that keeps ≥ 90 % (docs/methods.md §6.2)
    capo_gamma: float = 0.0
    capo_other: bool = True  # L_other on reasoning/format tokens with full-parameter gradient
    # the KL reference model (None: the model as at this run's start); `loop` passes its initial model
    ref_model: str | None = None
    # pact (§6.4)
    pact_q: float = 0.4
    pact_beta_sft: float = 0.1
    pact_lambda_start: float = 0.8
    pact_lambda_end: float = 0.2
    # one gate z_i per prompt for each pass over the samples (the paper's z_i^(e)), so all of a prompt's
    # rollouts share it wherever the shuffle puts them; "step": redrawn at every optimizer step
    pact_gate: str = option(
        "epoch", panel=PACT, help="pact: epoch (default: one anchor gate per prompt per pass over the samples, the "
        "paper's) | step (redrawn every optimizer step).")
    # the annealed reasoning-prefix level limits the privileged context c^h too (the paper: later updates
    # are "progressively closer to the prompt-only setting"); False: c^h always shows level 4, the level
    # limits the SFT targets only
    pact_level_limits_context: bool = option(
        True, "--pact-level-limits-context/--pact-level-sft-only", panel=PACT,
        help="pact: the annealed reasoning-prefix level limits the privileged context too (default, the paper's), "
        "or only the SFT targets.")
    # where this run lies in the whole training, for λ_a's and the level's annealing (the paper anneals
    # once over all of training): the schedule's step at this run's first step, and its horizon S
    # (None: this run's --steps). `loop` sets both, so the schedules run once over all its rounds
    pact_schedule_start: int = option(0, panel=PACT, help="pact: the step of the whole training this run starts at "
                                      "(λ_a and level annealing; default 0).")
    pact_schedule_steps: int | None = option(None, panel=PACT, help="pact: the annealing horizon S in steps (default: "
                                             "--steps; `loop` sets both over its rounds).")

    def kl_beta(self) -> float:
        if self.beta is not None:
            return self.beta
        return 0.001 if self.algo == "pact" else 0.0

    def tis_band(self) -> tuple[float, float]:
        """[L, H] of the behaviour weight (§6.5): H caps it (truncate) or bounds the kept band (mask,
        icepop); L bounds the band below. Also the band the mismatch metrics count tokens outside of."""
        icepop = self.tis_mode == "icepop"
        low = self.tis_low if self.tis_low is not None else (ICEPOP_BAND[0] if icepop else 0.0)
        high = self.tis_cap if self.tis_cap is not None else (ICEPOP_BAND[1] if icepop else 2.0)
        return float(low), float(high)

    def aggregation(self) -> str:
        return self.loss_agg if self.loss_agg is not None else get_algorithm(self.algo).loss_agg

    def validate(self) -> "TrainConfig":
        get_algorithm(self.algo)  # a clear error naming the choices
        if self.loss_agg is not None and self.loss_agg not in LOSS_AGGS:
            raise UserError(f"unknown --loss-agg {self.loss_agg!r}; choose one of {', '.join(LOSS_AGGS)}")
        from transformers.training_args import OptimizerNames

        if self.optim not in {o.value for o in OptimizerNames}:
            raise UserError(f"unknown optim {self.optim!r} (transformers' optimizer names, e.g. adamw_torch, sgd)")
        if self.tis_mode not in TIS_MODES:
            raise UserError(f"unknown tis_mode {self.tis_mode!r}; choose one of {', '.join(TIS_MODES)}")
        if self.tis_level not in TIS_LEVELS:
            raise UserError(f"unknown tis_level {self.tis_level!r}; choose one of {', '.join(TIS_LEVELS)}")
        if self.tis_mode == "icepop" and self.tis_level != "token":
            raise UserError("tis_mode icepop masks token by token; for a sequence band use tis_mode: mask, tis_level: sequence")
        low, high = self.tis_band()
        if not high >= 1.0:
            raise UserError(f"tis_cap must be at least 1 (an on-policy token weighs 1), got {high}")
        if not 0.0 <= low <= 1.0:
            raise UserError(f"tis_low must be in [0, 1] (an on-policy token weighs 1), got {low}")
        if self.ratio_to not in RATIO_TO:
            raise UserError(f"unknown ratio_to {self.ratio_to!r}; choose one of {', '.join(RATIO_TO)}")
        if self.capo_rule is not None and self.capo_rule not in CAPO_RULES:
            raise UserError(f"unknown capo_rule {self.capo_rule!r}; choose one of {', '.join(CAPO_RULES)}")
        if self.capo_units not in CAPO_UNITS or self.capo_remainder not in CAPO_REMAINDERS:
            raise UserError(f"capo_units must be one of {', '.join(CAPO_UNITS)} and capo_remainder one of {', '.join(CAPO_REMAINDERS)}")
        if not 0.0 <= self.capo_gamma <= 1.0 or not 0.0 < self.capo_rho <= 1.0:
            raise UserError(f"capo_gamma must be in [0, 1] and capo_rho in (0, 1], got {self.capo_gamma}, {self.capo_rho}")
        if self.ref_model is not None and not (Path(self.ref_model) / "config.json").is_file():
            raise UserError(f"ref_model {self.ref_model}: not a model directory (no config.json)")
        if self.ratio_to == "behaviour" and self.algo == "pact":
            # PACT's trace rows are scored under c^h, not under the context they were sampled in
            raise UserError("ratio_to: behaviour is for grpo, capo and matpo; pact's logp_old is under c^h (§6.4)")
        if not 0.0 <= self.negative_weight <= 1.0:
            raise UserError(f"negative_weight must be in [0, 1], got {self.negative_weight}")
        if self.pact_gate not in PACT_GATES:
            raise UserError(f"unknown pact_gate {self.pact_gate!r}; choose one of {', '.join(PACT_GATES)}")
        if self.algo == "capo" and self.loss_agg is not None:
            # capo.py weighs each term by its own class's token count, so no --loss-agg would be applied
            raise UserError(f"--loss-agg {self.loss_agg} does not apply to --algo capo: its action, args and other terms are "
                            "each a mean over their own class's tokens (docs/methods.md §6.2); leave it unset")
        if self.algo == "capo" and not self.partition:
            raise UserError("--algo capo needs --partition FILE (loaded if it exists; else made from the run's successful "
                            "rollouts and saved there; or make one with `harnessrl capo-partition`)")
        if self.steps < 1 or self.batch_size < 1 or self.grad_accum < 1:
            raise UserError("--steps, batch size and grad accumulation must be positive")
        if self.over_length not in OVER_LENGTH:
            raise UserError(f"unknown --over-length {self.over_length!r}; choose one of {', '.join(OVER_LENGTH)}")
        for name in ("max_tokens_per_microbatch", "max_sample_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 2:
                raise UserError(f"--{name.replace('_', '-')} must be at least 2 tokens, got {getattr(self, name)}")
        if self.pact_schedule_start < 0 or (self.pact_schedule_steps is not None and self.pact_schedule_steps < 1):
            raise UserError("pact_schedule_start must be ≥ 0 and pact_schedule_steps ≥ 1")
        if not 0.0 <= self.pact_q <= 1.0:
            raise UserError(f"pact_q must be in [0, 1], got {self.pact_q}")
        if self.epsilon <= 0 or (self.epsilon_high is not None and self.epsilon_high <= 0):
            raise UserError("epsilon must be positive")
        return self


def load_config(path: str | Path | None, overrides: dict[str, Any]) -> TrainConfig:
    """Defaults ← YAML file ← explicit overrides (CLI flags left unset are passed as None and ignored)."""
    import yaml

    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"config file not found: {p}")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"config file {p} is not valid YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(loaded, dict):
            raise UserError(f"config file {p} must hold a mapping of option: value")
        values.update({k.replace("-", "_"): v for k, v in loaded.items()})
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"unknown config option(s): {', '.join(unknown)}")
    types = {f.name: str(f.type) for f in fields(TrainConfig)}
    values = {k: _number(k, types[k], v) for k, v in values.items()}
    try:
        cfg = TrainConfig(**values)
    except TypeError as exc:
        raise UserError(f"bad config: {exc}") from None
    return cfg.validate()


def _number(name: str, annotation: str, value: Any) -> Any:
    """A number option's value as a number. YAML 1.1 (PyYAML) reads `1.0e9` or `1e-5` without a
    sign in the exponent as a string; a value that is no number at all is named, not a traceback."""
    kinds = {part.strip() for part in annotation.split("|")}
    number = float if "float" in kinds else int if "int" in kinds else None
    if number is None or value is None or isinstance(value, bool) or isinstance(value, int):
        return value
    try:
        if isinstance(value, float):
            if number is int and not value.is_integer():
                raise ValueError(value)
            return number(value)
        return number(value) if isinstance(value, str) else number(str(value))
    except ValueError:
        raise UserError(f"config option {name}: {value!r} is not {'a number' if number is float else 'an integer'}") \
            from None


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    return asdict(cfg)
