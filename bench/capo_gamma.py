"""How much of each token type's gradient CAPO's routing keeps, for several leak γ, partition sizes ρ
and routing rules (docs/methods.md §6.2: the measurement the default γ is chosen from).

    python bench/capo_gamma.py [--model DIR] [--tasks 4] [--k 4]

∇L_act and ∇L_args are computed once, separately, on the compiled batch of the tests' samples
(real tokenizer ids; the tiny model unless --model). For each rule the routed action gradient is
R_act⊙∇L_act (R_act: trainer/capo.py), and the table gives ‖R_act⊙∇L_act‖ / ‖∇L_act‖ (and the same
for args) over all parameters and over the transformer layers only (the partitionable weights: the
embeddings and LM head are in the shared remainder and dominate a small model's norm)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from trainer_fixtures import tiny_samples  # noqa: E402  (the tests' sample writer: real tokenizer ids)

GAMMAS = (0.0, 0.1, 0.25, 0.5, 1.0)
RHOS = (0.1, 0.25, 0.5)
RULES = (("heads_mlp", "shared"), ("mlp", "shared"), ("mlp", "leak"))


def kept(grads: dict, route: dict, params: list) -> float:
    """‖R⊙g‖ / ‖g‖ over `params` (R = 1 where `route` has no entry)."""
    num = sum(float(((route.get(p, 1.0) * grads[p]) ** 2).sum()) for p in params)
    den = sum(float((grads[p] ** 2).sum()) for p in params)
    return (num / den) ** 0.5 if den else float("nan")


def routes(model, part, units: str, remainder: str, gamma: float) -> tuple[dict, dict]:
    from harnessrl.trainer.capo_masks import partition_masks, withheld_masks

    m_act, m_args = (partition_masks(model, part, w, units) for w in ("act", "args"))
    if remainder == "shared":
        w = withheld_masks(m_act, m_args)
        return ({p: 1 - (1 - gamma) * c for p, c, _ in w}, {p: 1 - (1 - gamma) * c for p, _, c in w})
    # leak: M + γ(1 − M) on the partitioned weights, γ on every other parameter
    rest = {p: torch.tensor(gamma) for p in model.parameters() if p not in m_act}
    return ({**rest, **{p: m * (1 - gamma) + gamma for p, m in m_act.items()}},
            {**rest, **{p: m * (1 - gamma) + gamma for p, m in m_args.items()}})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model directory (default: build the tiny test model)")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from harnessrl.trainer.capo import CapoTrainer
    from harnessrl.trainer.capo_partition import build_partition, write_outputs
    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.data import load_samples
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix="bench-capo-gamma-"))
    if a.model is None:
        from harnessrl.tiny_model import build_tiny_model

        a.model = str(build_tiny_model(tmp / "tiny"))
    n = a.tasks * a.k
    samples = tiny_samples(tmp / "samples", Path(a.model), n_tasks=a.tasks, k=a.k, rewards=[1.0, 0.0] * n)
    data = load_samples(samples)
    model = AutoModelForCausalLM.from_pretrained(a.model)
    cfg = TrainConfig(samples=str(samples), model=a.model, out=str(tmp / "out"), algo="capo", partition=str(tmp / "p.pt"),
                      batch_size=n, report_to="none", capo_gamma=1.0).validate()
    tr = CapoTrainer(model, cfg, data, AutoTokenizer.from_pretrained(a.model))
    batch = tr.fixed_batch()
    grads = {}
    for name in ("act", "args"):
        model.zero_grad()
        tr.terms(model, batch)[name].backward()
        grads[name] = {p: p.grad.detach().clone() for p in model.parameters()}
    everything = list(model.parameters())
    layers = [p for layer in model.model.layers for p in layer.parameters()]
    print(f"model {a.model}: {sum(p.numel() for p in everything)} parameters, {sum(p.numel() for p in layers)} in the "
          f"layers; {n} samples; share of the gradient norm in the layers: act {_share(grads['act'], layers):.3f}, "
          f"args {_share(grads['args'], layers):.3f}")
    print("| units | remainder | ρ | γ | act kept (all) | args kept (all) | act kept (layers) | args kept (layers) |")
    print("|---|---|---|---|---|---|---|---|")
    for rho in RHOS:
        part, report = build_partition(model, data.samples, rho=rho)
        write_outputs(part, report, tmp / f"p{rho}.pt")
        for units, remainder in RULES:
            for gamma in GAMMAS:
                r_act, r_args = routes(model, part, units, remainder, gamma)
                row = [kept(grads["act"], r_act, everything), kept(grads["args"], r_args, everything),
                       kept(grads["act"], r_act, layers), kept(grads["args"], r_args, layers)]
                print(f"| {units} | {remainder} | {rho} | {gamma} | " + " | ".join(f"{x:.3f}" for x in row) + " |")


def _share(grads: dict, params: list) -> float:
    """‖g‖ over `params` ÷ ‖g‖ over all parameters."""
    part = sum(float((grads[p] ** 2).sum()) for p in params)
    return (part / sum(float((g ** 2).sum()) for g in grads.values())) ** 0.5


if __name__ == "__main__":
    main()
