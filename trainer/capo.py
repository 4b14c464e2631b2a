"""CAPO routing (docs/methods.md §6.2 step 4).

L_act / L_args / L_other are the clipped surrogate over action / args / other (reasoning, format,
unlabelled) trainable tokens, each normalised by its own token count over the optimizer step
(token_mean weights per class, trainer/normalise.py). With R_k the routing mask of class k,

    g = R_act⊙∇L_act + R_args⊙∇L_args + ∇L_other

`capo_remainder: shared` (the default): R_act = 1 − (1−γ)·C_act, C_act the args partition less the
action one (trainer/capo_masks.py), so each type updates its own partition and the shared
remainder fully and leaks γ into the other type's partition. Then

    g = ∇(L_act + L_args + L_other) − (1−γ)·(C_act⊙∇L_act + C_args⊙∇L_args)

TRL's ordinary backward gives the first term. A token's log-prob depends on the final hidden state
h only at the position that predicts it, so ∂L/∂h of that backward, split by the class of each
position, is exactly ∂L_act/∂h and ∂L_args/∂h: a hook on h runs the two corrections from there
(through the layers only, never the LM head again) while the backward is under way.

`capo_remainder: leak` (the earlier rule): R_k = M_k + γ(1 − M_k) everywhere, so with γ = 0 the
parameters in neither partition get only ∇L_other, and with L_other dropped they are frozen:
`requires_grad=False`, and inside a partially-partitioned weight, for any element whose gradient
has been exactly zero at every step so far, an optimizer step hook puts the old value back and
clears its optimizer state, so weight decay and momentum never move it.

The partition is static (the paper's): loaded from `partition` when the file exists, else built
from this run's successful rollouts and saved there; a run with no success and no file trains
unrouted. `tests/test_trainer_capo.py` checks the routed gradient against the masked sum of the
three separately computed gradients."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from harnessrl.errors import UserError
from harnessrl.samples import ACTION, ARGS
from harnessrl.trainer.capo_masks import Tap, partition_masks, taps, withheld_masks
from harnessrl.trainer.capo_partition import Partition, build_partition, probe_set, write_outputs
from harnessrl.trainer.diagnostics import masked_sums
from harnessrl.trainer.grpo import HarnessTrainer

log = logging.getLogger(__name__)


class CapoTrainer(HarnessTrainer):
    algo = "capo"

    def __init__(self, model, cfg, data, tokenizer, peft_config=None, callbacks=None, trl_args=None, partition: Partition | None = None):
        if cfg.lora or peft_config is not None:
            raise UserError("capo routes gradients over units of the full model; --lora is not supported with --algo capo")
        super().__init__(model, cfg, data, tokenizer, peft_config=peft_config, callbacks=callbacks, trl_args=trl_args)
        self.partition = partition or self.static_partition()
        self.routes: list[tuple[torch.nn.Parameter, torch.Tensor, torch.Tensor]] = []
        self.shared = cfg.capo_remainder == "shared"
        # gradients to add after the backward: (parameter, dim, indices, values); dim None: the whole parameter
        self._pending: list[tuple[torch.nn.Parameter, int | None, torch.Tensor | None, torch.Tensor]] = []
        self.taps: list[Tap] = []
        self._tapped: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # tap → (input, output) of this forward
        self._route_inputs = None
        self._hidden: torch.Tensor | None = None
        self._touched: dict[torch.nn.Parameter, torch.Tensor] = {}
        self._saved: dict[torch.nn.Parameter, torch.Tensor] = {}
        if self.partition is None or cfg.capo_gamma == 1:  # γ = 1 routes nothing away: plain backward
            return
        m_act, m_args = (partition_masks(self.model, self.partition, w, cfg.capo_units) for w in ("act", "args"))
        gamma = cfg.capo_gamma
        if self.shared:
            self.routes = withheld_masks(m_act, m_args)
            norm = getattr(getattr(self.model, "model", None), "norm", None)  # the final norm feeds the LM head
            if isinstance(norm, torch.nn.Module) and not self.args.gradient_checkpointing:
                self.taps = taps(self.model, self.routes)
                norm.register_forward_hook(self._keep_hidden)
                for i, tap in enumerate(self.taps):
                    tap.linear.register_forward_hook(self._keep_tap(i))
            return
        # leak: M' = M + γ(1 − M); a parameter outside every partition has M = 0, so M' = γ.
        none = torch.zeros(())
        routed = [p for p in self.model.parameters() if p.requires_grad and (gamma > 0 or p in m_act)]
        self.routes = [(p, m_act.get(p, none.to(p.device)) * (1 - gamma) + gamma, m_args.get(p, none.to(p.device)) * (1 - gamma) + gamma)
                       for p in routed]
        if gamma == 0 and not cfg.capo_other:
            keep = set(routed)
            for p in self.model.parameters():
                if p not in keep:
                    p.requires_grad_(False)

    def static_partition(self) -> Partition | None:
        """The file at `partition` if it exists (unless `capo_partition_refresh`), else one built from
        this run's probe set and saved there; None (an unrouted run) when there is neither."""
        path = Path(self.cfg.partition)
        has_success = bool(probe_set(self.data.samples))
        if path.is_file() and (not self.cfg.capo_partition_refresh or not has_success):
            part = Partition.load(path)
            made_by = part.meta.get("by", "activation")
            if self.cfg.capo_rule is not None and self.cfg.capo_rule != made_by:
                # a file made by another rule would train silently with the rule not asked for
                raise UserError(f"partition {path} was made by rule {made_by!r}, not capo_rule {self.cfg.capo_rule!r}: "
                                "set capo_partition_refresh: true to rebuild it, or another --partition file")
            return part
        if not has_success:
            log.warning("capo: no successful rollout in these samples and no partition at %s yet: this run trains "
                        "unrouted (CAPO's loss, plain gradient); the partition is made at the first run with a success", path)
            return None
        if self.accelerator.is_main_process:
            part, report = build_partition(self.model, self.data.samples, rho=self.cfg.capo_rho, units=self.cfg.capo_units,
                                           by=self.cfg.capo_rule or "activation")
            write_outputs(part, report, path)
            log.warning("capo: partition made from %d probe samples, saved to %s (later runs reuse it)", report["probe_samples"], path)
        self.accelerator.wait_for_everyone()
        return Partition.load(path)

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

    def _grads(self, loss: torch.Tensor, params: list[torch.nn.Parameter], retain: bool) -> list[torch.Tensor]:
        if not loss.requires_grad:  # no tokens of this class in the micro-batch
            return [torch.zeros_like(p) for p in params]
        grads = torch.autograd.grad(loss, params, retain_graph=retain, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]

    def _compute_loss(self, model, inputs):
        routing = self.model.training and bool(self.routes)
        self._route_inputs = inputs if routing and self.shared else None
        self._hidden, self._tapped = None, {}
        t = self.terms(model, inputs)
        other = t["other"] if self.cfg.capo_other else 0.0
        total = t["act"] + t["args"] + other
        if not routing:
            return total if total.requires_grad or not self.model.training else total + torch.zeros((), device=total.device, requires_grad=True)
        params = [p for p, _, _ in self.routes]
        if self.shared:
            if self._hidden is None:  # no hidden-state hook (no final norm found, checkpointing): from the terms
                self._route_inputs = None
                a = self._grads(t["act"], params, retain=True)
                b = self._grads(t["args"], params, retain=True)
                self._withhold(a, b)
            return total if total.requires_grad else total + torch.zeros((), device=total.device, requires_grad=True)
        g_act = self._grads(t["act"], params, retain=True)
        g_args = self._grads(t["args"], params, retain=self.cfg.capo_other)
        self._pending = [(p, None, None, ma * ga + mb * gb) for (p, ma, mb), ga, gb in zip(self.routes, g_act, g_args)]
        self._log_mean("grad_norm/act", _norm(ma * a for (_, ma, _), a in zip(self.routes, g_act)))
        self._log_mean("grad_norm/args", _norm(mb * b for (_, _, mb), b in zip(self.routes, g_args)))
        if self.cfg.capo_other and t["other"].requires_grad:
            # TRL's backward runs on L_other only; the value reported is the full loss.
            return t["other"] + (total - t["other"]).detach()
        return torch.zeros((), device=total.device, requires_grad=True) + total.detach()

    def _withhold(self, a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
        """Pending: −(1−γ)(C_act⊙∇L_act + C_args⊙∇L_args), added to the gradient after the backward."""
        keep = 1 - self.cfg.capo_gamma
        off_act = [ca * x for (_, ca, _), x in zip(self.routes, a)]
        off_args = [cb * x for (_, _, cb), x in zip(self.routes, b)]
        self._log_mean("grad_norm/act_withheld", keep * _norm(off_act))
        self._log_mean("grad_norm/args_withheld", keep * _norm(off_args))
        self._pending = [(p, None, None, -keep * (x + y)) for (p, _, _), x, y in zip(self.routes, off_act, off_args)]

    def _keep_hidden(self, _module, _args, output) -> None:
        if self._route_inputs is not None and output.requires_grad:
            self._hidden = output
            output.register_hook(self._route_at_hidden)

    def _keep_tap(self, i: int):
        def keep(_module, args, output) -> None:
            if self._route_inputs is not None and output.requires_grad:
                self._tapped[i] = (args[0], output)
        return keep

    def _route_at_hidden(self, dh: torch.Tensor) -> None:
        """Runs inside TRL's backward with dh = ∂(L_act + L_args + L_other)/∂h; the positions that
        predict action (args) tokens carry exactly ∂L_act/∂h (∂L_args/∂h)."""
        h, inputs = self._hidden, self._route_inputs
        if h is None:  # the hook fires again inside the two passes below, which start at h
            return
        self._hidden = self._route_inputs = None
        packed = inputs["packed"]
        cls = torch.where((inputs["loss_mask"] > 0) & packed.valid, inputs["token_class"], torch.zeros_like(inputs["token_class"]))
        pos = torch.zeros(h.shape[:2], dtype=torch.long, device=h.device)
        pos[0, packed.index[packed.valid]] = cls[packed.valid]  # row i's token j is predicted at index[i, j]
        tapped, self._tapped = self._tapped, {}
        # Each pass stops at the projections' outputs (the activation gradients δ only); the weight
        # gradient is then multiplied out on the withheld rows or columns alone (Tap.withheld).
        keep = 1 - self.cfg.capo_gamma
        for code, name in ((ACTION, "act"), (ARGS, "args")):
            need = [i for i, t in enumerate(self.taps) if t.idx[code].numel() and i in tapped]
            deltas = torch.autograd.grad(h, [tapped[i][1] for i in need], grad_outputs=dh * (pos == code).unsqueeze(-1).to(dh.dtype),
                                         retain_graph=True, allow_unused=True)
            sq = torch.zeros((), device=h.device)
            for i, d in zip(need, deltas):
                if d is None:
                    continue
                x = tapped[i][0]
                for p, dim, idx, g in self.taps[i].withheld(code, x.reshape(-1, x.size(-1)), d.reshape(-1, d.size(-1))):
                    self._pending.append((p, dim, idx, -keep * g))
                    sq = sq + (g.float() ** 2).sum()
            self._log_mean(f"grad_norm/{name}_withheld", keep * torch.sqrt(sq))

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        for p, dim, idx, g in self._pending:
            if self.accelerator.num_processes > 1:  # routed grads bypass DDP's hooks
                g = self.accelerator.reduce(g, reduction="mean")
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if dim is None:
                p.grad += g
            else:
                p.grad.index_add_(dim, idx, g.to(p.grad.dtype))
        self._pending = []
        return loss

    # -- freezing (capo_remainder: leak) ------------------------------------------------------------
    def create_optimizer(self, *args, **kwargs):
        opt = super().create_optimizer(*args, **kwargs)
        if not self.shared:
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


def _norm(tensors) -> torch.Tensor:
    return torch.sqrt(sum((t.float() ** 2).sum() for t in tensors))
