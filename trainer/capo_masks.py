"""CAPO's parameter masks (docs/methods.md §6.2 step 4): which elements of which parameters a
partition owns, shaped to broadcast against each parameter ((n, 1) for the output rows of a
projection, (1, n) for its input columns, (n,) for a bias), so they cost O(units) memory.

MLP unit u: row u of `gate_proj`/`up_proj` (and their biases), column u of `down_proj`.
Attention head h: its head_dim rows of `q_proj`, its columns of `o_proj`, and the rows of its
key/value head in `k_proj`/`v_proj`. Under grouped-query attention one key/value head serves a
group of query heads (`repeat_kv`: kv head j serves query heads j·g … j·g + g − 1), so its rows
belong to the partition when any query head of its group does."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harnessrl.errors import UserError
from harnessrl.trainer.capo_partition import Partition, head_dim


def _module(modules: dict[str, torch.nn.Module], name: str) -> torch.nn.Module:
    found = modules.get(name)
    if found is None:  # a wrapped model (PEFT, DDP) prefixes the names
        found = next((m for n, m in modules.items() if n.endswith("." + name)), None)
    if found is None:
        raise UserError(f"partition module {name!r} is not in this model: was the partition made for another model?")
    return found


def _rows(masks: dict, linear: torch.nn.Linear, u: torch.Tensor) -> None:
    masks[linear.weight] = u[:, None]
    if linear.bias is not None:
        masks[linear.bias] = u


def partition_masks(model: torch.nn.Module, partition: Partition, which: str, units: str) -> dict[torch.nn.Parameter, torch.Tensor]:
    """0/1 masks of the `which` ("act" or "args") partition over the MLP units of every layer, and
    over the attention heads too when `units` is "heads_mlp"."""
    modules = dict(model.named_modules())
    masks: dict[torch.nn.Parameter, torch.Tensor] = {}
    for layer, name in enumerate(partition.modules):
        mlp = _module(modules, name)
        w = mlp.down_proj.weight
        u = getattr(partition, which)[layer].to(w.device, w.dtype)
        if u.numel() != w.size(1):
            raise UserError(f"partition has {u.numel()} units in {name}, the model has {w.size(1)}")
        _rows(masks, mlp.gate_proj, u)
        _rows(masks, mlp.up_proj, u)
        masks[w] = u[None, :]
    if units == "mlp":
        return masks
    heads_of = getattr(partition, f"{which}_heads")
    if heads_of is None:
        raise UserError("this CAPO partition has MLP units only (made with capo_units: mlp, or before heads were "
                        "partitioned): set capo_units: mlp, or rebuild it with capo_partition_refresh: true")
    for layer, name in enumerate(partition.attn_modules):
        attn = _module(modules, name)
        w = attn.o_proj.weight
        hd = head_dim(attn)
        heads, kv = attn.o_proj.in_features // hd, attn.k_proj.out_features // hd
        h = heads_of[layer].to(w.device, w.dtype)
        if h.numel() != heads:
            raise UserError(f"partition has {h.numel()} heads in {name}, the model has {heads}")
        q = h.repeat_interleave(hd)
        shared_kv = h.view(kv, heads // kv).amax(1).repeat_interleave(hd)
        _rows(masks, attn.q_proj, q)
        _rows(masks, attn.k_proj, shared_kv)
        _rows(masks, attn.v_proj, shared_kv)
        masks[w] = q[None, :]
    return masks


def withheld_masks(m_act: dict, m_args: dict) -> list[tuple[torch.nn.Parameter, torch.Tensor, torch.Tensor]]:
    """(p, C_act, C_args) for `capo_remainder: shared`: C_act is where the action gradient is withheld
    (the args partition less the action one), C_args the converse. Elements in both partitions, or in
    neither (the shared remainder: embeddings, norms, LM head, unselected units), have C = 0."""
    return [(p, m_args[p] * (1 - m_act[p]), m_act[p] * (1 - m_args[p])) for p in m_act if p.requires_grad]


@dataclass
class Tap:
    """A routed projection for the fast path (trainer/capo.py): `idx[code]` are the output rows
    (`rows`; with the bias) or input columns where class `code`'s gradient is withheld."""

    linear: torch.nn.Linear
    rows: bool
    idx: dict[int, torch.Tensor]

    def withheld(self, code: int, x: torch.Tensor, delta: torch.Tensor) -> list[tuple[torch.nn.Parameter, int, torch.Tensor, torch.Tensor]]:
        """(parameter, dim, indices, gradient there) of the class-`code` loss, from the projection's
        input x (N, in) and the gradient δ (N, out) at its output: ∂L/∂W = δᵀx, restricted to the
        withheld rows (δ[:, rows]ᵀx) or columns (δᵀx[:, cols]), so only those are multiplied out."""
        i = self.idx[code]
        if self.rows:
            d = delta[:, i]
            out = [(self.linear.weight, 0, i, d.t() @ x)]
            if self.linear.bias is not None:
                out.append((self.linear.bias, 0, i, d.sum(0)))
            return out
        return [(self.linear.weight, 1, i, delta.t() @ x[:, i])]


def taps(model: torch.nn.Module, routes: list[tuple[torch.nn.Parameter, torch.Tensor, torch.Tensor]]) -> list[Tap]:
    """The projections whose weights `withheld_masks` routes (a bias goes with its weight's rows)."""
    from harnessrl.samples import ACTION, ARGS

    linear_of = {m.weight: m for m in model.modules() if isinstance(m, torch.nn.Linear)}
    found = []
    for p, c_act, c_args in routes:
        linear = linear_of.get(p)
        if linear is None:
            continue
        rows = c_act.size(1) == 1  # (out, 1): rows; (1, in): columns

        def where(c: torch.Tensor) -> torch.Tensor:
            return (c[:, 0] if rows else c[0]).nonzero().flatten()

        tap = Tap(linear, rows, {ACTION: where(c_act), ARGS: where(c_args)})
        if any(i.numel() for i in tap.idx.values()):
            found.append(tap)
    return found
