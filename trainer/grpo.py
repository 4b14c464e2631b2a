"""The TRL GRPOTrainer fed with compiled batches, and the `grpo` objective (docs/methods.md §6.1).

TRL's loop, optimizer, logging (`report_to`), accelerate/DeepSpeed/FSDP and fused log-prob head
are kept. Two methods change: `_generate_and_score_completions` collates compiled samples instead
of generating, and `_compute_loss` computes our objective from TRL's per-token log-probs.
`tests/test_trainer_grpo.py` checks the grpo loss equals TRL's own `_compute_loss` on the same tensors.
Loss normalisation over micro-batches and processes: trainer/normalise.py. Private TRL members:
trainer/trl_private.py."""

from __future__ import annotations

import os
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from harnessrl.errors import UserError
from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.data import Dataset, Sample, StepSampler, aggregate, collate
from harnessrl.trainer.losses import clip_fraction, clipped_surrogate, k3_kl, tis_weight
from harnessrl.trainer.normalise import token_weights, weighted_sum
from harnessrl.trainer.trl_private import TESTED, drift, log_metric, per_token_logps, text_tokenizer, trl_version


def grpo_args(cfg: TrainConfig, n_samples: int, **extra: Any) -> GRPOConfig:
    """TRL config for a compiled-sample run. `batch_size` samples per optimizer step over all
    processes (WORLD_SIZE, set by torchrun / accelerate launch). num_generations only satisfies
    TRL's checks: groups are already normalised by the compiler, and our sampler ignores it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_step = min(cfg.batch_size, n_samples)
    per_device = max(1, per_step // (cfg.grad_accum * world))
    if per_device * cfg.grad_accum * world < 2:
        raise UserError("a training step needs at least 2 samples (TRL's GRPO batch constraint)")
    kwargs = dict(
        output_dir=cfg.out,
        max_steps=cfg.steps,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        optim=cfg.optim,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=cfg.grad_accum,
        num_generations=per_device * cfg.grad_accum,
        beta=cfg.kl_beta(),
        epsilon=cfg.epsilon,
        epsilon_high=cfg.epsilon_high,
        temperature=cfg.temperature,
        report_to=cfg.report_to,
        logging_steps=cfg.logging_steps,
        seed=cfg.seed,
        bf16=cfg.bf16,
        save_strategy="no",
        dataloader_drop_last=n_samples >= per_device * cfg.grad_accum * world,
        disable_tqdm=False,
    )
    if cfg.gradient_checkpointing:
        kwargs["gradient_checkpointing"] = True
    if world > 1 and not torch.cuda.is_available():
        kwargs["use_cpu"] = True  # accelerate starts gloo data parallelism on CPU only when told so
    kwargs.update(extra)
    return GRPOConfig(**kwargs)


def compiled_reward(**_: Any) -> list[float]:
    """TRL wants a reward source; ours are in the samples already, so this is never called."""
    raise RuntimeError("rewards come from the compiled samples")


class HarnessTrainer(GRPOTrainer):
    """Base trainer; `objective` is the grpo loss. Subclasses override `objective` / `build_batch`."""

    algo = "grpo"

    def __init__(self, model, cfg: TrainConfig, data: Dataset, tokenizer, args: GRPOConfig | None = None, peft_config=None, callbacks=None):
        from datasets import Dataset as HFDataset

        self.cfg = cfg
        self.data = data
        args = args or grpo_args(cfg, len(data.samples))
        index = HFDataset.from_dict({"prompt": list(range(len(data.samples)))})
        super().__init__(
            model=model, reward_funcs=[compiled_reward], args=args, train_dataset=index, processing_class=tokenizer,
            peft_config=peft_config, callbacks=callbacks,
        )
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if self.accelerator.num_processes != world:
            raise UserError(f"WORLD_SIZE is {world} but accelerate runs {self.accelerator.num_processes} process(es)")
        problems = drift(self)
        if problems:
            raise UserError(f"{problems[0]}; harnessrl is tested with trl{TESTED} (installed: {trl_version()})")
        if self.args.steps_per_generation != self.args.gradient_accumulation_steps:
            # The step weights are computed on what one `_generate_and_score_completions` call sees.
            raise UserError("steps_per_generation must equal gradient_accumulation_steps (one batch per optimizer step)")
        self.tok = text_tokenizer(self)
        self.pad_id = self.tok.pad_token_id

    # -- data ---------------------------------------------------------------------------------
    def _get_train_sampler(self, dataset=None):
        # Compiled samples are already grouped and normalised: a seeded shuffle, each step's samples
        # once per micro-batch draw (StepSampler), as TRL's own sampler does without the group repeats.
        n = len(dataset if dataset is not None else self.train_dataset)
        chunk = self.args.per_device_train_batch_size * self.args.steps_per_generation * self.accelerator.num_processes
        return StepSampler(n, chunk, self.args.steps_per_generation * self.num_iterations, self.args.seed)

    def build_batch(self, samples: list[Sample]) -> dict[str, torch.Tensor]:
        return collate(samples, self.pad_id, self.accelerator.device)

    def step_weights(self, batch: dict[str, torch.Tensor], samples: list[Sample]) -> dict[str, torch.Tensor]:
        """Per-token loss weights for this process's rows of the whole optimizer step (normalise.py)."""
        return {"loss_weights": self.token_weights(batch["loss_mask"], samples, self.cfg.loss_agg)}

    def token_weights(self, mask: torch.Tensor, samples: list[Sample], mode: str) -> torch.Tensor:
        from accelerate.utils import gather_object

        gather = gather_object if self.accelerator.num_processes > 1 else None
        return token_weights(mask, [s.rollout_id for s in samples], mode, gather)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        # `inputs`: this process's rows of the whole optimizer step (all its micro-batches); TRL
        # splits the returned dict into micro-batches afterwards.
        samples = [self.data.samples[int(x["prompt"])] for x in inputs]
        batch = self.build_batch(samples)
        batch.update(self.step_weights(batch, samples))
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        keep = batch["completion_ids"].size(1)
        with torch.no_grad():
            # As in TRL: the start-of-step policy equals the current one unless generation and
            # optimisation are misaligned, and then it is recomputed here.
            generate_every = self.args.steps_per_generation * self.num_iterations
            if self.args.gradient_accumulation_steps % generate_every != 0:
                batch["old_per_token_logps"] = per_token_logps(self, self.model, ids, attn, keep)[0]
            if self.beta != 0.0:
                batch["ref_per_token_logps"] = self._reference_logps(ids, attn, keep)
        return batch

    def _reference_logps(self, ids: torch.Tensor, attn: torch.Tensor, keep: int) -> torch.Tensor:
        if self.ref_model is not None:
            return per_token_logps(self, self.ref_model, ids, attn, keep)[0]
        with self.accelerator.unwrap_model(self.model).disable_adapter():  # PEFT: the base model is the reference
            return per_token_logps(self, self.model, ids, attn, keep)[0]

    # -- loss ---------------------------------------------------------------------------------
    def policy_logps(self, model, inputs: dict[str, torch.Tensor], prefix: str = "") -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.cat([inputs[prefix + "prompt_ids"], inputs[prefix + "completion_ids"]], dim=1)
        attn = torch.cat([inputs[prefix + "prompt_mask"], inputs[prefix + "completion_mask"]], dim=1)
        return per_token_logps(self, model, ids, attn, inputs[prefix + "completion_ids"].size(1), compute_entropy=True)

    def per_token_loss(self, logps: torch.Tensor, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Clipped surrogate × truncated-IS weight + β·KL, per token; also returns logp_old."""
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        if self.cfg.ratio_to == "behaviour":
            behaviour = inputs["behaviour_logps"]
            old = torch.where(torch.isnan(behaviour), old, behaviour)  # unknown where the server sent none
        adv = inputs["advantages"]
        if self.cfg.negative_weight != 1.0:
            adv = torch.where(adv < 0, adv * self.cfg.negative_weight, adv)
        loss = clipped_surrogate(logps, old, adv, self.epsilon_low, self.epsilon_high)
        if self.cfg.tis:
            loss = loss * tis_weight(old, inputs["behaviour_logps"], self.cfg.tis_cap)
        if self.beta != 0.0:
            kl = k3_kl(logps, inputs["ref_per_token_logps"])
            loss = loss + self.beta * kl
            self._log("kl", aggregate(kl.detach(), inputs["loss_mask"], "token_mean"))
        return loss, old

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
        self._log("entropy", aggregate(entropy.detach(), mask, "token_mean"))
        self._log("clip_ratio", clip_fraction(logps, old, inputs["advantages"], mask, self.epsilon_low, self.epsilon_high))

    def _compute_loss(self, model, inputs):
        terms = self.objective(model, inputs)
        for name, value in terms.items():
            if name != "loss":
                self._log(f"loss/{name}", value)
        return terms["loss"]  # already this micro-batch's share: no division by the accumulation steps

    def _log(self, name: str, value: torch.Tensor | float) -> None:
        """Diagnostics (not the loss): per micro-batch values, averaged over processes and by TRL over a logging step."""
        mode = "train" if self.model.training else "eval"
        v = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        log_metric(self, mode, name, self.accelerator.gather(v.to(self.accelerator.device).reshape(1)).mean().item())

    def fixed_batch(self, indices: list[int] | None = None) -> dict[str, torch.Tensor]:
        """The batch `_generate_and_score_completions` would build for these samples (tests, bench)."""
        idx = range(len(self.data.samples)) if indices is None else indices
        return self._generate_and_score_completions([{"prompt": i} for i in idx])
