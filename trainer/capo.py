"""CAPO routing (docs/methods.md §6.2 step 4):

    g = (M_act + γ(1−M_act))⊙∇L_act + (M_args + γ(1−M_args))⊙∇L_args + ∇L_other

L_act / L_args / L_other are the clipped surrogate over action / args / other (reasoning, format,
unlabelled) trainable tokens, each normalised by its own token count over the optimizer step
(token_mean weights per class, trainer/normalise.py). ∇L_other is TRL's ordinary
backward; ∇L_act and ∇L_args are two extra passes (`torch.autograd.grad`) restricted to the
parameters the masks can reach (the partitioned MLP weights when γ = 0).

Faster exact route (γ = 0): a token's log-prob depends on the final hidden state h only at the
position that predicts it, and action and args tokens are disjoint, so one backward through the
LM head of L_act + L_args gives ∂/∂h of both, split by position masks; the two extra passes then
start at h and skip the LM head. `tests/test_trainer_capo.py` checks the routed gradient against
the masked sum of the three separately computed gradients.

Freezing: with γ = 0 and L_other dropped, every parameter outside the partitions gets
`requires_grad=False` (skipped by the optimizer). Inside a partially-partitioned weight, and for
any element whose gradient has been exactly zero at every step so far, an optimizer step hook puts
the old value back and clears its optimizer state, so weight decay and momentum never move it."""

from __future__ import annotations

import torch

from harnessrl.samples import ACTION, ARGS
from harnessrl.errors import UserError
from harnessrl.trainer.capo_partition import Partition
from harnessrl.trainer.diagnostics import masked_sums
from harnessrl.trainer.grpo import HarnessTrainer


def unit_masks(model: torch.nn.Module, partition: Partition, which: str) -> dict[torch.nn.Parameter, torch.Tensor]:
    """0/1 masks covering the partition's units, shaped to broadcast against each parameter
    ((units, 1) for gate/up rows, (1, units) for down columns), so they cost O(units) memory."""
    modules = dict(model.named_modules())
    units = getattr(partition, which)
    masks: dict[torch.nn.Parameter, torch.Tensor] = {}
    for layer, name in enumerate(partition.modules):
        mlp = modules.get(name)
        if mlp is None:  # a wrapped model (PEFT, DDP) prefixes the names
            mlp = next((m for n, m in modules.items() if n.endswith("." + name)), None)
        if mlp is None:
            raise UserError(f"partition module {name!r} is not in this model: was the partition made for another model?")
        u = units[layer].to(mlp.down_proj.weight.device, mlp.down_proj.weight.dtype)
        if u.numel() != mlp.down_proj.weight.size(1):
            raise UserError(f"partition has {u.numel()} units in {name}, the model has {mlp.down_proj.weight.size(1)}")
        for proj in (mlp.gate_proj, mlp.up_proj):
            masks[proj.weight] = u[:, None]
            if proj.bias is not None:
                masks[proj.bias] = u
        masks[mlp.down_proj.weight] = u[None, :]
    return masks


class CapoTrainer(HarnessTrainer):
    algo = "capo"

    def __init__(self, model, cfg, data, tokenizer, peft_config=None, callbacks=None, trl_args=None, partition: Partition | None = None):
        if cfg.lora or peft_config is not None:
            raise UserError("capo routes gradients over MLP units of the full model; --lora is not supported with --algo capo")
        self.partition = partition or Partition.load(cfg.partition)
        gamma = cfg.capo_gamma
        m_act, m_args = unit_masks(model, self.partition, "act"), unit_masks(model, self.partition, "args")
        routed = [p for p in model.parameters() if p.requires_grad and (gamma > 0 or p in m_act)]
        # M' = M + γ(1 − M); a parameter outside every partition has M = 0, so M' = γ.
        none = torch.zeros(())
        self.routes = [
            (p, m_act.get(p, none.to(p.device)) * (1 - gamma) + gamma, m_args.get(p, none.to(p.device)) * (1 - gamma) + gamma)
            for p in routed
        ]
        if gamma == 0 and not cfg.capo_other:
            keep = set(routed)
            for p in model.parameters():
                if p not in keep:
                    p.requires_grad_(False)
        self._pending: list[torch.Tensor] | None = None
        self._hidden: torch.Tensor | None = None
        norm = getattr(getattr(model, "model", None), "norm", None)  # the final norm feeds the LM head
        if gamma == 0 and isinstance(norm, torch.nn.Module):
            norm.register_forward_hook(self._keep_hidden)
        self._touched: dict[torch.nn.Parameter, torch.Tensor] = {}
        self._saved: dict[torch.nn.Parameter, torch.Tensor] = {}
        super().__init__(model, cfg, data, tokenizer, peft_config=peft_config, callbacks=callbacks, trl_args=trl_args)
        self.routes = [(p, ma.to(p.device), mb.to(p.device)) for p, ma, mb in self.routes]  # the model may have moved

    def _keep_hidden(self, _module, _args, output) -> None:
        self._hidden = output if output.requires_grad else None

    # -- loss terms -----------------------------------------------------------------------------
    @staticmethod
    def class_masks(inputs) -> dict[str, torch.Tensor]:
        mask, cls = inputs["loss_mask"], inputs["token_class"]
        m_act, m_args = mask * (cls == ACTION), mask * (cls == ARGS)
        return {"act": m_act, "args": m_args, "other": mask - m_act - m_args}

    def step_weights(self, batch, samples):
        return {f"w_{k}": self.token_weights(m, samples, "token_mean") for k, m in self.class_masks(batch).items()}

    def terms(self, model, inputs) -> dict[str, torch.Tensor]:
        """This micro-batch's shares of L_act, L_args, L_other (each summing over the step to its token mean)."""
        logps, entropy = self.policy_logps(model, inputs)
        per_token, old = self.per_token_loss(logps, inputs)
        self.log_token_stats(logps, old, entropy, inputs)
        for name, m in self.class_masks(inputs).items():
            self._log_mean(f"loss/{name}", *masked_sums(per_token.detach(), m))
        return {k: self.share(per_token, inputs[f"w_{k}"]) for k in ("act", "args", "other")}

    def objective(self, model, inputs):
        t = self.terms(model, inputs)
        loss = t["act"] + t["args"] + (t["other"] if self.cfg.capo_other else 0.0)
        return {"loss": loss, **t}

    def _grads(self, loss: torch.Tensor, retain: bool) -> list[torch.Tensor]:
        params = [p for p, _, _ in self.routes]
        if not loss.requires_grad:  # no tokens of this class in the micro-batch
            return [torch.zeros_like(p) for p in params]
        grads = torch.autograd.grad(loss, params, retain_graph=retain, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]

    def _compute_loss(self, model, inputs):
        t = self.terms(model, inputs)
        total = (t["act"] + t["args"] + (t["other"] if self.cfg.capo_other else 0.0)).detach()
        if not self.model.training:
            return total
        if self._hidden is not None:
            g_act, g_args = self._grads_from_hidden(t, inputs)
        else:
            g_act = self._grads(t["act"], retain=True)
            g_args = self._grads(t["args"], retain=self.cfg.capo_other)
        self._log_grad_stats(g_act, g_args)
        self._pending = [ma * ga + mb * gb for (_, ma, mb), ga, gb in zip(self.routes, g_act, g_args)]
        if self.cfg.capo_other and t["other"].requires_grad:
            # TRL's backward runs on L_other only; the value reported is the full loss.
            return t["other"] + (total - t["other"].detach())
        return torch.zeros((), device=total.device, requires_grad=True) + total

    def _grads_from_hidden(self, t: dict[str, torch.Tensor], inputs) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        h, self._hidden = self._hidden, None
        params = [p for p, _, _ in self.routes]
        both = t["act"] + t["args"]
        if not both.requires_grad:
            return [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
        (dh,) = torch.autograd.grad(both, h, retain_graph=True)
        # Row i's completion token j is predicted at packed position index[i, j] (trainer/packing.py).
        packed = inputs["packed"]
        cls = torch.where((inputs["loss_mask"] > 0) & packed.valid, inputs["token_class"], torch.zeros_like(inputs["token_class"]))
        pos = torch.zeros(h.shape[:2], dtype=torch.long, device=h.device)
        pos[0, packed.index[packed.valid]] = cls[packed.valid]
        out = []
        for code, retain in ((ACTION, True), (ARGS, self.cfg.capo_other)):
            g = torch.autograd.grad(h, params, grad_outputs=dh * (pos == code).unsqueeze(-1), retain_graph=retain, allow_unused=True)
            out.append([torch.zeros_like(p) if x is None else x for p, x in zip(params, g)])
        return out[0], out[1]

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self._pending is not None:
            if self.cfg.capo_other:
                self._log_mean("grad_norm/other", torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None)))
            for (p, _, _), g in zip(self.routes, self._pending):
                if self.accelerator.num_processes > 1:  # routed grads bypass DDP's hooks
                    g = self.accelerator.reduce(g, reduction="mean")
                p.grad = g if p.grad is None else p.grad + g
            self._pending = None
        return loss

    def _log_grad_stats(self, g_act: list[torch.Tensor], g_args: list[torch.Tensor]) -> None:
        dot = sum((a.float() * b.float()).sum() for a, b in zip(g_act, g_args))
        na = torch.sqrt(sum((a.float() ** 2).sum() for a in g_act))
        nb = torch.sqrt(sum((b.float() ** 2).sum() for b in g_args))
        self._log_mean("grad_norm/act", torch.sqrt(sum(((ma * a).float() ** 2).sum() for (_, ma, _), a in zip(self.routes, g_act))))
        self._log_mean("grad_norm/args", torch.sqrt(sum(((mb * b).float() ** 2).sum() for (_, _, mb), b in zip(self.routes, g_args))))
        self._log_mean("grad_cosine/act_args", dot / (na * nb).clamp(min=1e-12))

    # -- freezing ---------------------------------------------------------------------------------
    def create_optimizer(self, *args, **kwargs):
        opt = super().create_optimizer(*args, **kwargs)
        inner = getattr(opt, "optimizer", opt)
        inner.register_step_pre_hook(self._before_step)
        inner.register_step_post_hook(self._after_step)
        return opt

    def _before_step(self, optimizer, *_):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                touched = self._touched.get(p)
                nonzero = p.grad != 0
                touched = nonzero if touched is None else touched | nonzero
                self._touched[p] = touched
                if not bool(touched.all()):
                    self._saved[p] = p.detach()[~touched].clone()

    def _after_step(self, optimizer, *_):
        with torch.no_grad():
            for p, values in self._saved.items():
                untouched = ~self._touched[p]
                p[untouched] = values
                for state in optimizer.state.get(p, {}).values():
                    if isinstance(state, torch.Tensor) and state.shape == p.shape:
                        state[untouched] = 0
        self._saved.clear()
