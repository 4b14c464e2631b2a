"""MATPO (docs/methods.md §6.3): one model, every role. The batch is the augmented batch of planner and
worker samples from the same rollouts; the advantage is the compiler's `matpo` estimator (one
scalar per rollout, broadcast to every sample of the rollout); the paper's per-rollout mean (each
rollout's clipped terms averaged over its planner and worker tokens, then over rollouts:
`rollout_mean`, the default; `--loss-agg token_mean` is the token mean over the augmented batch),
ε = 0.2, β = 0 unless configured."""

from __future__ import annotations

from collections import defaultdict

import torch

from harnessrl.errors import UserError
from harnessrl.trainer.data import Dataset
from harnessrl.trainer.diagnostics import masked_sums
from harnessrl.trainer.grpo import HarnessTrainer


def check_broadcast(data: Dataset, tol: float = 1e-5) -> None:
    """Every trainable token of a rollout must carry the rollout's one advantage."""
    values: dict[str, set[float]] = defaultdict(set)
    for s in data.samples:
        for m, a in zip(s.loss_mask, s.advantage):
            if m:
                values[s.rollout_id].add(round(a / tol) * tol)
    bad = [r for r, v in values.items() if len(v) > 1]
    if bad:
        raise UserError(f"rollout {bad[0]} has per-token advantages that differ: compile with `--advantage matpo` for --algo matpo")


class MatpoTrainer(HarnessTrainer):
    algo = "matpo"

    def __init__(self, model, cfg, data, tokenizer, **kwargs):
        check_broadcast(data)
        super().__init__(model, cfg, data, tokenizer, **kwargs)
        self._agents = sorted({s.agent or "unknown" for s in data.samples})

    def build_batch(self, samples):
        batch = super().build_batch(samples)
        batch["agent_index"] = torch.tensor([self._agents.index(s.agent or "unknown") for s in samples], device=batch["loss_mask"].device)
        return batch

    def objective(self, model, inputs):
        logps, entropy = self.policy_logps(model, inputs)
        per_token, old = self.per_token_loss(logps, inputs)
        mask = inputs["loss_mask"]
        self.log_token_stats(logps, old, entropy, inputs)
        terms = {"loss": self.share(per_token, inputs["loss_weights"])}
        per_step = 1.0 / (self.args.gradient_accumulation_steps * self.accelerator.num_processes)
        for i, agent in enumerate(self._agents):
            role = mask * (inputs["agent_index"] == i)[:, None]
            self._log_mean(f"tokens/{agent}", role.sum(), per_step)  # the role's trainable tokens per step
            terms[f"role_{agent}"] = masked_sums(per_token.detach(), role)
        return terms
