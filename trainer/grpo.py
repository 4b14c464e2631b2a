"""The TRL GRPOTrainer fed with compiled batches, and the `grpo` objective (docs/methods.md §6.1).

TRL's loop, optimizer, logging (`report_to`), accelerate/DeepSpeed/FSDP and fused log-prob head
are kept. What changes: each optimizer step's samples and their micro-batches come from a
`StepPlan` (trainer/steps.py: micro-batches by token budget), each micro-batch is one packed row
(trainer/packing.py: no padding, memory linear in length), and `_compute_loss` computes our
objective from the packed log-probs. `tests/test_trainer_grpo.py` checks the grpo loss equals TRL's
own `_compute_loss` on the same batch. Loss normalisation over micro-batches and processes:
trainer/normalise.py. Private TRL members: trainer/trl_private.py."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from harnessrl.errors import UserError
from harnessrl.trainer.budget import LONG_SAMPLE, default_budget, memory_guard
from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.data import Dataset, Sample, collate, limit_length
from harnessrl.trainer.diagnostics import Diagnostics, masked_sums
from harnessrl.trainer.losses import behaviour_weight, clipped_surrogate, clipped_tokens, k3_kl, mismatch_kl
from harnessrl.trainer.normalise import token_weights, weighted_sum
from harnessrl.trainer.packing import Packed, pack, packed_logps, use_packed_attention
from harnessrl.trainer.prefix_tree import MIN_SHARED
from harnessrl.trainer.progress import show_progress
from harnessrl.trainer.sharding import check as check_sharding
from harnessrl.trainer.sharding import cpu_args
from harnessrl.trainer.steps import StepPlan
from harnessrl.trainer.trl_private import TESTED, drift, log_metric, reference_from, step_counter, text_tokenizer, trl_version

log = logging.getLogger(__name__)

# TRL's dataloader only paces its loop (one draw per micro-batch); what it draws is never read, the
# samples come from the StepPlan. 2 placeholder rows a draw satisfy GRPOConfig's check of at least 2
# generations per prompt, which is about generating (never done here): --batch-size 1 trains.
PLACEHOLDER_ROWS = 2


def grpo_args(cfg: TrainConfig, micro: int = 1, checkpointing: bool = False, **extra: Any) -> GRPOConfig:
    """TRL config for `micro` micro-batches per optimizer step and process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    kwargs = dict(
        output_dir=cfg.out,
        max_steps=cfg.steps,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        optim=cfg.optim,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=PLACEHOLDER_ROWS,
        gradient_accumulation_steps=micro,
        steps_per_generation=1,  # one dataloader draw per micro-batch
        num_generations=PLACEHOLDER_ROWS,
        beta=cfg.kl_beta(),
        epsilon=cfg.epsilon,
        epsilon_high=cfg.epsilon_high,
        temperature=cfg.temperature,
        report_to=cfg.report_to,
        logging_steps=cfg.logging_steps,
        seed=cfg.seed,
        bf16=cfg.bf16,
        save_strategy="no",
        dataloader_drop_last=True,
        disable_tqdm=False,
        activation_checkpointing=checkpointing,  # TRL's default is on; off is faster for short samples
        dataloader_pin_memory=torch.cuda.is_available(),  # nothing to pin to without a GPU (torch warns)
    )
    kwargs.update(cpu_args(world, cfg.bf16))
    kwargs.update(extra)
    return GRPOConfig(**kwargs)


def compiled_reward(**_: Any) -> list[float]:
    """TRL wants a reward source; ours are in the samples already, so this is never called."""
    raise RuntimeError("rewards come from the compiled samples")


def prompt_key(sample: Sample) -> str:
    """The prompt x_i a sample answers: its task (a sample without one is its own prompt)."""
    return sample.task_id or sample.rollout_id


class Pacer(torch.utils.data.Sampler):
    """Placeholder indices for TRL's dataloader: `steps` optimizer steps' worth of draws (all processes)."""

    def __init__(self, total: int):
        self.total = total

    def __iter__(self):
        return iter([0] * self.total)

    def __len__(self) -> int:
        return self.total


class HarnessTrainer(GRPOTrainer):
    """Base trainer; `objective` is the grpo loss. Subclasses override `objective` / `build_batch`."""

    algo = "grpo"

    def __init__(self, model, cfg: TrainConfig, data: Dataset, tokenizer, peft_config=None, callbacks=None,
                 trl_args: dict[str, Any] | None = None):
        from datasets import Dataset as HFDataset

        self.cfg = cfg
        self.tok = tokenizer
        self.data = self.limit_lengths(data)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        per_step = min(cfg.batch_size, len(self.data.samples))
        if per_step < world:
            raise UserError(f"{per_step} sample(s) a step cannot be shared by {world} processes: raise --batch-size")
        tokens = [self.sample_tokens(s) for s in self.data.samples]
        checkpointing = cfg.gradient_checkpointing if cfg.gradient_checkpointing is not None else max(tokens) >= LONG_SAMPLE
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() else torch.device("cpu")
        self.budget = cfg.max_tokens_per_microbatch or default_budget(model, device, checkpointing)
        longest = max(range(len(tokens)), key=tokens.__getitem__)
        if tokens[longest] > self.budget:
            s = self.data.samples[longest]
            raise UserError(f"sample {s.sample_id} has {tokens[longest]} tokens to train, more than --max-tokens-per-microbatch "
                            f"{self.budget}: raise it if memory allows, or cap samples with --max-sample-tokens N "
                            "(truncated; --over-length skip leaves them out)")
        self.plan = StepPlan(tokens, per_step, world, cfg.seed, cfg.steps, self.budget, cfg.grad_accum)
        log.warning("micro-batches of at most %d tokens: %d per step and process (%d samples a step), activation checkpointing %s",
                    self.budget, self.plan.micro, per_step, "on" if checkpointing else "off")
        args = grpo_args(cfg, self.plan.micro, checkpointing, **(trl_args or {}))
        use_packed_attention(model)
        index = HFDataset.from_dict({"prompt": list(range(len(self.data.samples)))})
        if cfg.ref_model and args.beta != 0.0 and (cfg.lora or peft_config is not None):
            raise UserError("ref_model needs full fine-tuning: with --lora the KL reference is the base model under the adapter")
        with reference_from(model, cfg.ref_model if args.beta != 0.0 else None):
            super().__init__(
                model=model, reward_funcs=[compiled_reward], args=args, train_dataset=index, processing_class=tokenizer,
                peft_config=peft_config, callbacks=callbacks,
            )
        if self.ref_model is not None:
            use_packed_attention(self.ref_model)
        show_progress(self)
        if self.accelerator.num_processes != world:
            raise UserError(f"WORLD_SIZE is {world} but accelerate runs {self.accelerator.num_processes} process(es)")
        check_sharding(self.accelerator, self.algo)
        problems = drift(self)
        if problems:
            raise UserError(f"{problems[0]}; harnessrl is tested with trl{TESTED} (installed: {trl_version()})")
        if self.num_iterations != 1:
            raise UserError("num_iterations must be 1: one optimizer step per batch of samples")
        self.tok = text_tokenizer(self)
        self.pad_id = self.tok.pad_token_id
        self._micro: list[dict[str, Any]] = []
        self._running: list[Sample] = []
        self._diagnostics = Diagnostics()
        self._at_step: int | None = None  # the step a batch is built for, when not the current one
        self._round_old: dict[tuple[int, int], torch.Tensor] | None = None  # ratio_to round: (step, slot) → logp_old

    # -- data ---------------------------------------------------------------------------------
    def limit_lengths(self, data: Dataset) -> Dataset:
        if self.cfg.max_sample_tokens is None:
            return data
        samples, truncated, skipped = limit_length(data.samples, self.cfg.max_sample_tokens, self.cfg.over_length)
        if truncated or skipped:
            log.warning("--max-sample-tokens %d: %d sample(s) truncated, %d skipped (of %d)",
                        self.cfg.max_sample_tokens, truncated, skipped, len(data.samples))
        if not samples:
            raise UserError(f"no sample left with --max-sample-tokens {self.cfg.max_sample_tokens} (--over-length {self.cfg.over_length})")
        return Dataset(samples, data.tasks)

    def sample_tokens(self, sample: Sample) -> int:
        """Tokens a sample puts into its micro-batch's forward passes (the budget counts these)."""
        return len(sample.input_ids)

    def _get_train_sampler(self, dataset=None):
        return Pacer(self.plan.per_epoch * self.plan.micro * PLACEHOLDER_ROWS * self.accelerator.num_processes)

    def _prepare_inputs(self, generation_batch):
        # Called by TRL's training_step once per micro-batch: the step's micro-batches are built at its first.
        slot = step_counter(self) % self.args.gradient_accumulation_steps
        if slot == 0:
            step = step_counter(self) // self.args.gradient_accumulation_steps
            if step == 0 and self.cfg.ratio_to == "round":
                self._round_old = self.round_start_logps()
            self._micro = self.micro_batches(self.step_groups(step))
            for k, mb in enumerate(self._micro):
                if self._round_old and (step, k) in self._round_old:
                    mb["old_per_token_logps"] = self._round_old.pop((step, k)).to(self.accelerator.device)
        self._running = self._micro[slot]["samples"]
        return self._micro[slot]

    def step_groups(self, step: int) -> list[list[Sample]]:
        return [[self.data.samples[i] for i in g] for g in self.plan.micro_batches(step, self.accelerator.process_index)]

    @torch.no_grad()
    def round_start_logps(self) -> dict[tuple[int, int], torch.Tensor]:
        """`ratio_to: round`: logp_old of every micro-batch of steps 1 … S−1 under the policy as it is
        now, before the run's first optimizer step (step 0's are its own detached log-probs). Each
        batch is built as its step will build it (PACT: that step's gates, level and c^h rows)."""
        out = {}
        for step in range(1, self.args.max_steps):
            self._at_step = step
            try:
                micro = self.micro_batches(self.step_groups(step), reference=False)
            finally:
                self._at_step = None
            for k, mb in enumerate(micro):
                out[(step, k)] = self.policy_logps(self.model, mb)[0].cpu()
        return out

    def plan_step(self) -> int:
        """The optimizer step the batch being built belongs to."""
        return self.state.global_step if self._at_step is None else self._at_step

    def training_step(self, model, inputs, num_items_in_batch=None):
        with memory_guard(self.describe_running):
            return super().training_step(model, inputs, num_items_in_batch)

    def describe_running(self) -> str:
        longest = max(self._running, key=lambda s: self.sample_tokens(s), default=None)
        if longest is None:
            return "a micro-batch"
        return (f"a micro-batch of {len(self._running)} sample(s), {sum(map(self.sample_tokens, self._running))} tokens "
                f"(longest: sample {longest.sample_id}, {self.sample_tokens(longest)} tokens; --max-tokens-per-microbatch {self.budget})")

    def build_batch(self, samples: list[Sample]) -> dict[str, torch.Tensor]:
        return collate(samples, self.pad_id, self.accelerator.device)

    def step_weights(self, batch: dict[str, torch.Tensor], samples: list[Sample]) -> dict[str, torch.Tensor]:
        """Per-token loss weights for this process's rows of the whole optimizer step (normalise.py)."""
        return {"loss_weights": self.token_weights(batch["loss_mask"], samples, self.cfg.aggregation())}

    def token_weights(self, mask: torch.Tensor, samples: list[Sample], mode: str) -> torch.Tensor:
        from accelerate.utils import gather_object

        gather = gather_object if self.accelerator.num_processes > 1 else None
        keys = [prompt_key(s) if mode == "prompt_mean" else s.rollout_id for s in samples]
        return token_weights(mask, keys, mode, gather)

    def micro_batches(self, groups: list[list[Sample]], reference: bool = True) -> list[dict[str, Any]]:
        """This process's micro-batches of one optimizer step: the step's padded columns and loss weights,
        computed on all its rows at once, then each group's rows packed for the forward passes."""
        samples = [s for g in groups for s in g]
        batch = self.build_batch(samples)
        batch.update(self.step_weights(batch, samples))
        out, at = [], 0
        for g in groups:
            part = {k: v[at:at + len(g)] if v.dim() else v for k, v in batch.items()}
            at += len(g)
            self._running = g
            out.append(self.prepare_micro_batch(part, g, reference))
        return out

    def prepare_micro_batch(self, batch: dict[str, Any], samples: list[Sample], reference: bool = True) -> dict[str, Any]:
        batch["samples"] = samples
        batch["packed"] = self.pack_rows(batch)
        if self.beta != 0.0 and reference:
            with torch.no_grad():
                batch["ref_per_token_logps"] = self._reference_logps(batch["packed"])
        return batch

    def pack_rows(self, batch: dict[str, torch.Tensor]) -> Packed:
        """The rows' prompt + completion tokens, padding dropped, as one packed row scoring the completions."""
        p, c = batch["prompt_mask"].sum(1).tolist(), batch["completion_mask"].sum(1).tolist()
        P = batch["prompt_ids"].size(1)
        seqs = [torch.cat([batch["prompt_ids"][i, P - p[i]:], batch["completion_ids"][i, :c[i]]]) for i in range(len(p))]
        return pack(seqs, p, batch["completion_ids"].size(1), self.accelerator.device,
                    MIN_SHARED if self.cfg.shared_prefix else None)

    def _reference_logps(self, packed: Packed) -> torch.Tensor:
        if self.ref_model is not None:
            return packed_logps(self, self.ref_model, packed)[0]
        with self.accelerator.unwrap_model(self.model).disable_adapter():  # PEFT: the base model is the reference
            return packed_logps(self, self.model, packed)[0]

    # -- loss ---------------------------------------------------------------------------------
    def policy_logps(self, model, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, completion) log-probs and entropies of the micro-batch's completions under `model`."""
        return packed_logps(self, model, inputs["packed"], compute_entropy=True)

    def per_token_loss(self, logps: torch.Tensor, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Clipped surrogate × behaviour weight + β·KL, per token (§6, §6.5); also returns logp_old."""
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        behaviour, mask = inputs["behaviour_logps"], inputs["loss_mask"]
        known = mask * ~torch.isnan(behaviour)  # trained tokens with a recorded sampling log-prob
        self.log_behaviour_gap(old, behaviour, mask, known)
        self.log_mismatch(old, behaviour, known, self.sampled_context_rows(inputs))
        if self.cfg.ratio_to == "behaviour":
            old = torch.where(torch.isnan(behaviour), old, behaviour)  # unknown where the server sent none
        adv = inputs["advantages"]
        if self.cfg.negative_weight != 1.0:
            adv = torch.where(adv < 0, adv * self.cfg.negative_weight, adv)
        loss = clipped_surrogate(logps, old, adv, self.epsilon_low, self.epsilon_high)
        if self.cfg.tis:
            low, high = self.cfg.tis_band()
            w, cut = behaviour_weight(old, behaviour, high, self.cfg.tis_mode, low, self.cfg.tis_level, mask)
            loss = loss * w
            self._log_mean("behaviour/weight_mean", *masked_sums(w, mask))
            self._log_mean("behaviour/capped_frac", *masked_sums(cut.float(), known))
        if self.beta != 0.0:
            kl = k3_kl(logps, inputs["ref_per_token_logps"])
            loss = loss + self.beta * kl
            self._log_mean("kl", *masked_sums(kl.detach(), inputs["loss_mask"]))
        return loss, old

    def log_behaviour_gap(self, old: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, known: torch.Tensor) -> None:
        """How far the sampling (behaviour) policy lies from the proximal one (logp_old before ratio_to:
        behaviour replaces it: the policy at the step's or round's start), over the trained tokens: the
        share without a recorded log-prob (§6.5: weight 1), and over those with one the mean
        |logp_old − logp_behaviour| and the largest exp(logp_old − logp_behaviour), before any cap."""
        self._log_mean("behaviour/unknown_frac", (mask - known).sum(), mask.sum())
        if not bool(known.any()):
            return
        gap = (old.detach() - behaviour)[known > 0]
        self._log_mean("behaviour/abs_gap", gap.abs().sum(), gap.numel())
        self._log_max("behaviour/raw_weight_max", gap.exp().max())

    def sampled_context_rows(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        """(rows,) 1 where a row's logp_old is scored in the context its tokens were sampled in; None:
        every row. The mismatch metrics count those rows only (PACT's c^h rows differ by the context)."""
        return None

    def log_mismatch(self, old: torch.Tensor, behaviour: torch.Tensor, known: torch.Tensor, rows: torch.Tensor | None) -> None:
        """The training–inference mismatch (§6.5), correction on or off and at staleness 0 too, over the
        trained tokens with a recorded log-prob: the k3 estimate of KL(π_behaviour ‖ π_old) on them, and
        the share whose token ratio r_t lies outside the band [L, H] of `tis_band`."""
        counted = known if rows is None else known * rows[:, None].to(known.dtype)
        if not bool(counted.any()):
            return
        sel = counted > 0
        gap = (old.detach() - behaviour)[sel]
        kl = mismatch_kl(old, behaviour)[sel]
        low, high = self.cfg.tis_band()
        r = gap.exp()
        self._log_mean("mismatch/kl", kl.sum(), kl.numel())
        self._log_mean("mismatch/out_of_band_frac", ((r < low) | (r > high)).sum(), r.numel())

    def share(self, per_token: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """This micro-batch's share of the step's loss (the shares of a step sum to its aggregate)."""
        return weighted_sum(per_token, weights, self.accelerator.num_processes)

    def objective(self, model, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Loss terms for one micro-batch; "loss" is its share of the step's loss, what is minimised.
        On `fixed_batch()` (one process, the whole batch) it is the loss of the batch."""
        logps, entropy = self.policy_logps(model, inputs)
        per_token, old = self.per_token_loss(logps, inputs)
        self.log_token_stats(logps, old, entropy, inputs)
        return {"loss": self.share(per_token, inputs["loss_weights"])}

    def log_token_stats(self, logps: torch.Tensor, old: torch.Tensor, entropy: torch.Tensor, inputs: dict[str, torch.Tensor]) -> None:
        mask = inputs["loss_mask"]
        self._log_mean("entropy", *masked_sums(entropy.detach(), mask))
        self._log_mean("clip_ratio", clipped_tokens(logps, old, inputs["advantages"], mask, self.epsilon_low, self.epsilon_high), mask.sum())

    def _compute_loss(self, model, inputs):
        terms = self.objective(model, inputs)
        for name, value in terms.items():
            if name != "loss":
                self._log_mean(f"loss/{name}", *(value if isinstance(value, tuple) else (value, 1.0)))
        return terms["loss"]  # already this micro-batch's share: no division by the accumulation steps

    def _log_mean(self, name: str, num: torch.Tensor | float, den: torch.Tensor | float = 1.0) -> None:
        """A diagnostic (not the loss) as Σ num / Σ den over the micro-batches and processes of the
        steps up to the next log (trainer/diagnostics.py): token-weighted when num sums a token value
        and den counts the tokens, so it does not depend on the split; den = 1 averages per micro-batch."""
        self._diagnostics.add("train" if self.model.training else "eval", name, num, den)

    def _log_max(self, name: str, value: torch.Tensor | float) -> None:
        """A diagnostic logged as its largest value over the micro-batches and processes since the last log."""
        self._diagnostics.add_max("train" if self.model.training else "eval", name, value)

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        gather = None
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object as gather
        for mode, name, value in self._diagnostics.flush(gather):
            log_metric(self, mode, name, value)
        super().log(logs, *args, **kwargs)

    def train(self, *args, **kwargs):
        self._diagnostics.clear()  # values of objective calls before training (tests, benches) are not the run's
        return super().train(*args, **kwargs)

    def fixed_batch(self, indices: list[int] | None = None) -> dict[str, Any]:
        """These samples (default: all) as one micro-batch, as a step would build it (tests, bench)."""
        idx = range(len(self.data.samples)) if indices is None else indices
        return self.micro_batches([[self.data.samples[i] for i in idx]])[0]
