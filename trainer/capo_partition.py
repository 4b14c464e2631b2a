"""CAPO partitions (docs/methods.md §6.2 steps 1–3): activation statistics of the structural units of
every layer per token class on a probe set of successful rollouts, layer-wise importance, and the
partition rule (`RULES`): whole layers ranked by layer-wise importance (`layers`, the paper's
"layer-wise importance … used to construct" the partitions), or the top-ρ units of every layer
(`activation`, `contrast`: this project's earlier rules, kept as departures).

Units (the paper's "layers and structural units"): an MLP unit u of layer l is the u-th input of
`down_proj` (act(gate)·up); its parameters are row u of `gate_proj`/`up_proj` and column u of
`down_proj`. An attention head h of layer l is its slice of the input of `o_proj` (the head's
output); its parameters are its rows of `q_proj`, its columns of `o_proj`, and the rows of its
key/value head in `k_proj`/`v_proj` (shared by the query heads of a GQA group: trainer/capo_masks.py).
A unit's activation is the mean |value| over its coordinates (1 for an MLP unit, head_dim for a
head), read at the position that predicts the token."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harnessrl.samples import ACTION, ARGS
from harnessrl.errors import UserError
from harnessrl.trainer.data import Sample
from harnessrl.trainer.packing import pack, use_packed_attention

CLASSES = {"action": ACTION, "args": ARGS}
UNITS = ("heads_mlp", "mlp")
# how a class's partition is chosen from the statistics (docs/methods.md §6.2 step 3):
#   layers: every unit of the top ⌈ρ·L⌉ layers by the class's layer importance s^k_l (the paper's);
#   layers_contrast: the same, layers ranked by s^k_l − s^other_l (ours: the two classes' shares
#     often rank the same layers first, and then `layers` gives both classes the same layers);
#   activation: the top ⌈ρ·U⌉ units of every layer by a^k (departure: the earlier default);
#   contrast: the same by a^k − a^other (departure)
RULES = ("activation", "contrast", "layers", "layers_contrast")


def mlp_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, mlp) for every gated MLP (gate_proj/up_proj/down_proj) in layer order."""
    found = [(n, m) for n, m in model.named_modules() if all(hasattr(m, a) for a in ("gate_proj", "up_proj", "down_proj"))]
    if not found:
        raise UserError("CAPO needs a gated-MLP model (gate_proj/up_proj/down_proj, as in Llama/Qwen/Mistral)")
    return found


def attention_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, attention) for every q/k/v/o-projection attention module, in layer order."""
    return [(n, m) for n, m in model.named_modules() if all(hasattr(m, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj"))]


def head_dim(attn: torch.nn.Module) -> int:
    return int(getattr(attn, "head_dim", None) or attn.o_proj.in_features // attn.config.num_attention_heads)


def probe_set(samples: list[Sample], threshold: float | None = None) -> list[Sample]:
    """Samples of successful rollouts: outcome ≥ threshold, or by default the group's best and > 0."""
    if threshold is not None:
        return [s for s in samples if s.outcome_reward >= threshold]
    best: dict[str, float] = defaultdict(lambda: float("-inf"))
    for s in samples:
        best[s.group_id or s.rollout_id] = max(best[s.group_id or s.rollout_id], s.outcome_reward)
    return [s for s in samples if s.outcome_reward > 0 and s.outcome_reward == best[s.group_id or s.rollout_id]]


def probe_rows(samples: list[Sample], max_tokens: int) -> list[list[Sample]]:
    """Consecutive samples grouped into packed rows of at most `max_tokens` tokens (a longer one alone)."""
    rows: list[list[Sample]] = [[]]
    for s in samples:
        if rows[-1] and sum(len(x.input_ids) for x in rows[-1]) + len(s.input_ids) > max_tokens:
            rows.append([])
        rows[-1].append(s)
    return [r for r in rows if r]


@torch.no_grad()
def activation_stats(model: torch.nn.Module, samples: list[Sample], max_tokens: int = 32768) -> dict[str, torch.Tensor]:
    """a^k_{l,u} = mean over probe tokens of class k of |h_{l,u}(t)|, as (layers, units) per class k
    ("action", "args": MLP units; "action_heads", "args_heads": attention heads, (layers, heads)).

    The samples run packed (trainer/packing.py) and each layer's activations are summed over the
    selected positions as they are made, so memory is linear in a sample's length."""
    mlps, attns = mlp_modules(model), attention_modules(model)
    units = mlps[0][1].down_proj.in_features
    sums = {k: torch.zeros(len(mlps), units) for k in CLASSES}
    if attns:
        heads = attns[0][1].o_proj.in_features // head_dim(attns[0][1])
        sums.update({f"{k}_heads": torch.zeros(len(attns), heads) for k in CLASSES})
    counts = dict.fromkeys(CLASSES, 0.0)
    at: dict[str, torch.Tensor] = {}  # class → packed positions of this row's class tokens

    def hook(i, suffix, width):
        def fn(_module, args):
            for name, pos in at.items():
                x = args[0][0, pos].detach().abs().float()
                sums[name + suffix][i] += x.view(x.size(0), -1, width).mean(-1).sum(0).cpu()
        return fn

    handles = [m.down_proj.register_forward_pre_hook(hook(i, "", 1)) for i, (_, m) in enumerate(mlps)]
    handles += [a.o_proj.register_forward_pre_hook(hook(i, "_heads", head_dim(a))) for i, (_, a) in enumerate(attns)]
    device = next(model.parameters()).device
    use_packed_attention(model)
    was_training = model.training
    try:
        model.eval()
        for row in probe_rows(samples, max_tokens):
            width = max(len(s.input_ids) - s.prompt_len for s in row)
            cls = torch.zeros((len(row), width), dtype=torch.long)
            for i, s in enumerate(row):
                trained = [c if m else 0 for c, m in zip(s.token_class[s.prompt_len:], s.loss_mask[s.prompt_len:])]
                cls[i, :len(trained)] = torch.tensor(trained, dtype=torch.long)
            packed = pack([torch.tensor(s.input_ids) for s in row], [s.prompt_len for s in row], width, device)
            # A token is produced at the position before it: that is where its log-prob (and the
            # gradient CAPO routes) comes from, so its activation is read there.
            for name, code in CLASSES.items():
                sel = (cls.to(device) == code) & packed.valid
                at[name] = packed.index[sel]
                counts[name] += float(sel.sum())
            model(input_ids=packed.input_ids, position_ids=packed.position_ids, packed_bounds=packed.bounds)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    out = {}
    for name in CLASSES:
        if not counts[name]:
            raise UserError(f"the probe set has no {name} tokens: compile with token classes, or lower the probe threshold")
    for key, total in sums.items():
        out[key] = total / counts[key.removesuffix("_heads")]
    return out


def layer_importance(a: torch.Tensor) -> list[float]:
    """s_l = Σ_u a_{l,u} / Σ_{l',u} a_{l',u}."""
    per_layer = a.sum(1)
    return (per_layer / per_layer.sum()).tolist()


def top_units(score: torch.Tensor, rho: float) -> torch.Tensor:
    """Boolean (layers, units): per layer, the top ⌈ρ·units⌉ units by score."""
    # Rounded to 9 places first so that a product like 0.3·10 = 3.0000000000000004 is 3, not 4.
    k = max(1, math.ceil(round(rho * score.size(1), 9)))
    mask = torch.zeros_like(score, dtype=torch.bool)
    mask.scatter_(1, score.topk(k, dim=1).indices, True)
    return mask


def top_layers(importance: torch.Tensor, rho: float, units: int) -> torch.Tensor:
    """Boolean (layers, units): every unit of the top ⌈ρ·layers⌉ layers by `importance` (one score a
    layer), so a class's partition is whole layers, as the layer-wise importance ranks them."""
    k = max(1, math.ceil(round(rho * importance.numel(), 9)))  # rounded as in top_units
    mask = torch.zeros(importance.numel(), units, dtype=torch.bool)
    mask[importance.topk(k).indices] = True
    return mask


def class_masks(a: torch.Tensor, b: torch.Tensor, rho: float, by: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The action and args partitions of one kind of unit (MLP units or heads) from their (layers,
    units) statistics a (action) and b (args), by rule `by` (RULES)."""
    if by == "activation":
        return top_units(a, rho), top_units(b, rho)
    if by == "contrast":
        return top_units(a - b, rho), top_units(b - a, rho)
    s_a, s_b = torch.tensor(layer_importance(a)), torch.tensor(layer_importance(b))
    if by == "layers_contrast":
        s_a, s_b = s_a - s_b, s_b - s_a
    return top_layers(s_a, rho, a.size(1)), top_layers(s_b, rho, b.size(1))


@dataclass
class Partition:
    modules: list[str]  # names of the MLP modules, layer order
    act: torch.Tensor  # bool (layers, units)
    args: torch.Tensor
    meta: dict
    # attention heads (bool (layers, heads)) and their modules; empty for an MLP-only partition
    # (`capo_units: mlp`, or a file written before heads were partitioned)
    attn_modules: list[str] = field(default_factory=list)
    act_heads: torch.Tensor | None = None
    args_heads: torch.Tensor | None = None

    def save(self, path: str | Path) -> None:
        torch.save({"modules": self.modules, "act": self.act, "args": self.args, "meta": self.meta,
                    "attn_modules": self.attn_modules, "act_heads": self.act_heads, "args_heads": self.args_heads}, path)

    @classmethod
    def load(cls, path: str | Path) -> "Partition":
        p = Path(path)
        if not p.is_file():
            raise UserError(f"partition file not found: {p}")
        try:
            d = torch.load(p, map_location="cpu", weights_only=True)
            heads = [None if d.get(k) is None else d[k].bool() for k in ("act_heads", "args_heads")]
            return cls(d["modules"], d["act"].bool(), d["args"].bool(), d["meta"], list(d.get("attn_modules", [])), *heads)
        except Exception as exc:
            raise UserError(f"{p} is not a CAPO partition file ({type(exc).__name__})") from None


def build_partition(model, samples: list[Sample], rho: float = 0.25, by: str = "activation",
                    threshold: float | None = None, units: str = "heads_mlp") -> tuple[Partition, dict]:
    """`units`: "heads_mlp" (attention heads and MLP units of every layer, the paper's "layers and
    structural units") or "mlp" (MLP units only, the earlier partition). `by`: the rule (RULES); ρ is
    the share of each layer's units (activation, contrast) or of the layers (layers, layers_contrast)."""
    if not 0 < rho <= 1:
        raise UserError(f"rho must be in (0, 1], got {rho}")
    if by not in RULES:
        raise UserError(f"unknown CAPO partition rule {by!r}; choose one of {', '.join(RULES)}")
    if units not in UNITS:
        raise UserError(f"unknown CAPO units {units!r}; choose one of {', '.join(UNITS)}")
    probe = probe_set(samples, threshold)
    if not probe:
        raise UserError("no successful rollout in the samples to probe (no group has a best outcome > 0)")
    stats = activation_stats(model, probe)
    parts = {}
    kinds = ("", "_heads") if units == "heads_mlp" and "action_heads" in stats else ("",)
    for kind in kinds:
        parts[kind] = class_masks(stats["action" + kind], stats["args" + kind], rho, by)
    act, args = parts[""]
    report = {
        "probe_samples": len(probe),
        "rho": rho,
        "by": by,
        "units": units,
        "importance": {"action": layer_importance(stats["action"]), "args": layer_importance(stats["args"])},
        # a layer the action partition leaves out (the layer rules) overlaps nowhere: 0, not 0/0
        "overlap_per_layer": ((act & args).sum(1).float() / act.sum(1).clamp(min=1).float()).tolist(),
        "units_per_layer": int(act.size(1)),
    }
    names = [n for n, _ in mlp_modules(model)]
    part = Partition(names, act, args, report)
    if "_heads" in parts:
        part.attn_modules = [n for n, _ in attention_modules(model)]
        part.act_heads, part.args_heads = parts["_heads"]
        report["importance_heads"] = {"action": layer_importance(stats["action_heads"]), "args": layer_importance(stats["args_heads"])}
        report["heads_per_layer"] = int(part.act_heads.size(1))
    return part, report


def plot_importance(report: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    for key, what in (("importance", "MLP"), ("importance_heads", "heads")):
        for name, values in report.get(key, {}).items():
            ax.plot(range(len(values)), values, marker="o", label=f"{name} ({what})")
    ax.set_xlabel("layer")
    ax.set_ylabel("share of activation")
    ax.set_title("CAPO layer-wise importance")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(partition: Partition, report: dict, out: str | Path) -> tuple[Path, Path, Path]:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partition.save(out)
    js, png = out.with_suffix(".json"), out.with_suffix(".png")
    js.write_text(json.dumps(report, indent=2))
    plot_importance(report, png)
    return out, js, png
