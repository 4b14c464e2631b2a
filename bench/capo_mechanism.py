"""CAPO's mechanism check (issue 53, "What to measure" §1; docs/benchmarks.md › CAPO's mechanism
check): on a real batch, do the action and the args gradients interfere, and does CAPO's routing
change that?

    # the batch: the toolbox family's rollouts, recorded through the proxy's local backend from the
    # demo's SFT warm start (round 0 of a one-round demo), and that warm start (about 2 minutes)
    harnessrl demo --tiny --out /tmp/capo-mech/demo --rounds 1 --algo grpo
    # the tiny model (the warm start that sampled the batch: on-policy), about 1 minute
    python bench/capo_mechanism.py --db /tmp/capo-mech/demo/loop/runs.db --model /tmp/capo-mech/demo/warm-model \\
        --out /tmp/capo-mech/tiny --label tiny-warm
    # SmolLM2-135M-Instruct (`harnessrl smollm2 /tmp/smol`): the same rollouts re-rendered with its chat
    # template (--retokenize: the compiler's path for calls recorded without ids), a few groups
    python bench/capo_mechanism.py --db /tmp/capo-mech/demo/loop/runs.db --model /tmp/smol --retokenize \\
        --groups 6 --lr 1e-6 --out /tmp/capo-mech/smol --label smollm2

The run's rollouts are compiled with `harnessrl compile --algo grpo` (outcome reward, group-normalised
advantage) and the model's tokenizer; `--groups N` keeps the first N groups whose advantage is not
all zero. On that batch, at ρ = 1 (logp_old = the model's own log-probs), the CAPO trainer's own
loss terms (trainer/capo.py `terms`: the clipped surrogate over action / args tokens, each a token
mean over its class) give ∇L_act and ∇L_args, one forward and two backwards. Then, per setting:

- routing off (`off`): the plain gradients, split by token class;
- CAPO's routing with a partition built by trainer/capo_partition.py `build_partition` (rule
  `activation`, `contrast`, `layers`, `layers_contrast`; ρ 0.25, heads and MLP units) and masks from
  trainer/capo_masks.py (`partition_masks`, `withheld_masks`, through bench/capo_gamma.py `routes`):
  remainder `shared` (R_act = 1 − (1−γ)·C_act) or `leak` (R_k = M_k + γ(1 − M_k)), at several γ.
  The routed gradients are R_act⊙∇L_act and R_args⊙∇L_args, which is what the trainer's routed
  backward gives (`tests/test_trainer_capo.py::test_routed_gradient_is_masked_sum`).

Measured per setting:
- cos(R_act⊙∇L_act, R_args⊙∇L_args) over all parameters, over the transformer layers, and per
  parameter group (embeddings and tied head, attention, MLP, norms; per layer in the JSON);
- one args-only optimizer step (parameters moved by R_args⊙∇L_args alone, then put back): the
  change of the action tokens' log-probs (mean over action tokens; over those of samples with a
  positive and with a negative advantage), of L_act (> 0: the args step worsened the action
  objective) and of L_args (the step's own gain), with Adam's first step (lr `--lr`; from zero
  moments it moves every parameter with a gradient by about ±lr) and with SGD at the lr that gives
  the unrouted args step the same parameter-space length as Adam's.
Results go to a JSON line appended to `--json` (default bench/results/capo_mechanism.jsonl)."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable

import torch

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = (  # (rule, remainder, γ); rule None: routing off
    (None, None, None),
    ("activation", "shared", 0.0), ("activation", "shared", 0.1), ("activation", "shared", 0.5),
    ("activation", "leak", 0.0), ("activation", "leak", 0.1), ("activation", "leak", 0.5),
    ("contrast", "shared", 0.0), ("contrast", "leak", 0.0),
    ("layers", "shared", 0.0), ("layers", "leak", 0.0),
    ("layers_contrast", "shared", 0.0), ("layers_contrast", "leak", 0.0),
)


# -- the math (tests/test_bench_capo_mechanism.py checks it on hand-worked numbers) -------------------
def dot(a: dict, b: dict, params: Iterable) -> float:
    return sum(float((a[p].double() * b[p].double()).sum()) for p in params)


def cosine(a: dict, b: dict, params: Iterable) -> float:
    """cos(a, b) = ⟨a, b⟩ / (‖a‖‖b‖) over `params` (dicts parameter → gradient); nan if either is 0."""
    params = list(params)
    na, nb = dot(a, a, params), dot(b, b, params)
    return dot(a, b, params) / math.sqrt(na * nb) if na > 0 and nb > 0 else float("nan")


def routed(grads: dict, route: dict) -> dict:
    """R⊙g per parameter (R = 1 where `route` has no entry)."""
    return {p: (route[p] * g if p in route else g) for p, g in grads.items()}


@contextmanager
def stepped(params: list[torch.nn.Parameter], grads: dict, optimizer: str, lr: float):
    """The parameters after one optimizer step on `grads` alone (a fresh optimizer: Adam's first
    step, or SGD), put back on exit. Yields the step's length ‖Δθ‖."""
    saved = [p.detach().clone() for p in params]
    try:
        for p in params:
            p.grad = grads[p].detach().clone().to(p.dtype)
        opt = (torch.optim.Adam(params, lr=lr, weight_decay=0.0) if optimizer == "adam"
               else torch.optim.SGD(params, lr=lr))
        opt.step()
        length = math.sqrt(sum(float(((p.detach() - s).double() ** 2).sum()) for p, s in zip(params, saved)))
        yield length
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
                p.grad = None


def step_effect(params: list, grads: dict, optimizer: str, lr: float, measure: Callable[[], dict],
                before: dict | None = None) -> dict:
    """measure() after one step on `grads` minus measure() before (each a dict of floats; `before`
    when given), and the step's length; the parameters are left as they were."""
    before = measure() if before is None else before
    with stepped(params, grads, optimizer, lr) as length:
        after = measure()
    return {**{k: after[k] - before[k] for k in before}, "step_norm": length}


def param_groups(model: torch.nn.Module) -> dict[str, list[torch.nn.Parameter]]:
    """Distinct trainable parameters by group: embed (embeddings, the tied head), attn, mlp, norm,
    layers (every parameter of the transformer layers), layer<i>, all."""
    groups: dict[str, list] = defaultdict(list)
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        groups["all"].append(p)
        parts = name.split(".")
        if "layers" in parts:
            i = int(parts[parts.index("layers") + 1])
            groups["layers"].append(p)
            groups[f"layer{i}"].append(p)
        kind = ("attn" if "self_attn" in parts else "mlp" if "mlp" in parts else "norm" if "norm" in name
                else "embed" if "embed" in name or "lm_head" in name else "other")
        groups[kind].append(p)
    return dict(groups)


# -- the batch ----------------------------------------------------------------------------------------
def compile_run(db: Path, run: str, model: str, out: Path, retokenize: bool) -> Path:
    """`harnessrl compile --algo grpo` of one run, with the model's tokenizer; with `retokenize`, on a
    copy of the DB whose calls have no ids, so the compiler re-renders them with the model's template."""
    out.mkdir(parents=True, exist_ok=True)
    if retokenize:
        copy = out / "records.db"
        shutil.copy(db, copy)
        with sqlite3.connect(copy) as con:
            con.execute("UPDATE calls SET prompt_ids = NULL, completion_ids = NULL, completion_logprobs = NULL")
        db = copy
    samples = out / "samples"
    subprocess.run([str(Path(sys.executable).with_name("harnessrl")), "compile", "--db", str(db), "--run", run,
                    "--algo", "grpo", "--tokenizer", model, "--out", str(samples), "--jobs", "1"],
                   check=True, stdout=subprocess.DEVNULL)
    return samples


def pick_groups(samples: list, n: int | None) -> list:
    """The samples of the first n groups (by id) whose advantages are not all zero (all of them: None)."""
    by = defaultdict(list)
    for s in samples:
        by[s.group_id or s.rollout_id].append(s)
    live = [g for g in sorted(by) if any(a != 0 for s in by[g] for a in s.advantage)]
    return [s for g in (live if n is None else live[:n]) for s in by[g]]


# -- the run ------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", type=Path, help="records DB holding the run's rollouts")
    ap.add_argument("--run", default="round-0-a1", help="run tag of the rollouts (default: a demo's round 0)")
    ap.add_argument("--model", help="model directory")
    ap.add_argument("--retokenize", action="store_true", help="re-render the calls with the model's chat template")
    ap.add_argument("--groups", type=int, default=None, help="first N groups with a non-zero advantage (default all)")
    ap.add_argument("--rho", type=float, default=0.25)
    ap.add_argument("--lr", type=float, default=2e-4, help="Adam's lr (default: the demo's)")
    ap.add_argument("--optimizers", default="adam,sgd")
    ap.add_argument("--sgd-gain", type=float, default=1e-3,
                    help="SGD's lr is set so the unrouted args step's first-order gain −lr·‖∇L_args‖² is this")
    ap.add_argument("--halves", action=argparse.BooleanOptionalAction, default=True,
                    help="also the reference cosines between the two halves' gradients of one class")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--label", default=None)
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/capo_mechanism.jsonl")
    ap.add_argument("--table", action="store_true", help="only print the markdown table of each line of --json")
    a = ap.parse_args()
    if a.table:
        for line in a.json.read_text().splitlines():
            print(table(json.loads(line)))
        return
    if not (a.db and a.model and a.out):
        ap.error("--db, --model and --out are required (unless --table)")
    torch.set_num_threads(a.threads)
    sys.path.insert(0, str(ROOT / "bench"))
    from capo_gamma import routes  # noqa: E402  (the masks of trainer/capo_masks.py, per rule)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harnessrl.samples import ACTION, ARGS
    from harnessrl.trainer.capo import CapoTrainer
    from harnessrl.trainer.capo_partition import build_partition
    from harnessrl.trainer.config import TrainConfig
    from harnessrl.trainer.data import load_samples

    t0 = time.perf_counter()
    samples_dir = compile_run(a.db, a.run, a.model, a.out, a.retokenize)
    data = load_samples(samples_dir)
    data.samples = pick_groups(data.samples, a.groups)
    n = len(data.samples)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    cfg = TrainConfig(samples=str(samples_dir), model=a.model, out=str(a.out / "trainer"), algo="capo",
                      partition=str(a.out / "unused.pt"), batch_size=n, report_to="none", capo_gamma=1.0).validate()
    part0, _ = build_partition(model, data.samples, rho=a.rho, by="activation")  # handed to the trainer, which routes nothing (γ = 1)
    tr = CapoTrainer(model, cfg, data, AutoTokenizer.from_pretrained(a.model), partition=part0)
    batch = tr.fixed_batch()
    mask, cls, adv = batch["loss_mask"], batch["token_class"], batch["advantages"]
    act, args_ = (mask > 0) & (cls == ACTION), (mask > 0) & (cls == ARGS)
    tokens = int(sum(len(s.input_ids) for s in data.samples))
    print(f"{a.label or a.model}: {n} samples, {tokens} tokens, {int(act.sum())} action and {int(args_.sum())} args "
          f"tokens trained; {sum(p.numel() for p in model.parameters())} parameters", flush=True)

    groups = param_groups(model)
    params = groups["all"]
    t = time.perf_counter()
    terms = tr.terms(model, batch)
    g = {}
    for i, name in enumerate(("act", "args")):
        gs = torch.autograd.grad(terms[name], params, retain_graph=i == 0, allow_unused=True)
        g[name] = {p: torch.zeros_like(p) if x is None else x.detach() for p, x in zip(params, gs)}
    del terms
    fwd_bwd = time.perf_counter() - t
    print(f"one forward and two backwards: {fwd_bwd:.1f} s", flush=True)

    reference = {}
    if a.halves:  # what a cosine between two gradients that share a cause looks like here: one class, two halves
        gids = sorted({s.group_id or s.rollout_id for s in data.samples})
        half = [[i for i, s in enumerate(data.samples) if (gids.index(s.group_id or s.rollout_id) < len(gids) // 2) == first]
                for first in (True, False)]
        hg = []
        for idx in half:
            tm = tr.terms(model, tr.fixed_batch(idx))
            hg.append({name: dict(zip(params, (torch.zeros_like(p) if x is None else x.detach() for p, x in zip(
                params, torch.autograd.grad(tm[name], params, retain_graph=name == "act", allow_unused=True)))))
                for name in ("act", "args")})
            del tm
        reference = {f"{k}_halves": {gname: cosine(hg[0][k], hg[1][k], ps) for gname, ps in groups.items()} for k in ("act", "args")}
        reference["act_args_cross_halves"] = {gname: cosine(hg[0]["act"], hg[1]["args"], ps) for gname, ps in groups.items()}
        del hg
        print("reference, cos of one class's gradients on two halves of the groups: act {:+.3f}, args {:+.3f}; act of "
              "one half and args of the other {:+.3f}".format(reference["act_halves"]["all"], reference["args_halves"]["all"],
                                                            reference["act_args_cross_halves"]["all"]), flush=True)

    with torch.no_grad():
        old = tr.policy_logps(model, batch)[0]

    def measure() -> dict:
        with torch.no_grad():
            logps = tr.policy_logps(model, batch)[0]
            per_token, _ = tr.per_token_loss(logps, {**batch, "old_per_token_logps": old})
            w = {k: float(tr.share(per_token, batch[f"w_{k}"])) for k in ("act", "args")}
        d = logps - old
        pos, neg = act & (adv > 0), act & (adv < 0)
        return {"logp_act": float(logps[act].mean()), "logp_act_pos": float(logps[pos].mean()) if pos.any() else float("nan"),
                "logp_act_neg": float(logps[neg].mean()) if neg.any() else float("nan"),
                "logp_args": float(logps[args_].mean()), "L_act": w["act"], "L_args": w["args"],
                "abs_dlogp_act": float(d[act].abs().mean())}

    at_start = measure()
    parts = {"activation": part0}
    rows = []
    sgd_lr = None
    for rule, remainder, gamma in SETTINGS:
        if rule is None:
            r_act = r_args = {}
            overlap = None
        else:
            if rule not in parts:
                parts[rule] = build_partition(model, data.samples, rho=a.rho, by=rule)[0]
            r_act, r_args = routes(model, parts[rule], "heads_mlp", remainder, gamma)
            p_ = parts[rule]
            overlap = {"mlp": float((p_.act & p_.args).sum() / p_.act.sum()),
                       "heads": float((p_.act_heads & p_.args_heads).sum() / p_.act_heads.sum()),
                       "act_layers": sorted({int(i) for i in p_.act.any(1).nonzero().flatten()}),
                       "args_layers": sorted({int(i) for i in p_.args.any(1).nonzero().flatten()})}
        ga, gb = routed(g["act"], r_act), routed(g["args"], r_args)
        row = {"rule": rule or "off", "remainder": remainder, "gamma": gamma, "overlap": overlap,
               "cos": {k: cosine(ga, gb, ps) for k, ps in groups.items()},  # the two routed updates
               # the args update against the action objective's own gradient: what decides the erosion
               "cos_erosion": {k: cosine(g["act"], gb, ps) for k, ps in groups.items()},
               "norm_act": math.sqrt(dot(ga, ga, params)), "norm_args": math.sqrt(dot(gb, gb, params)),
               "kept_args": math.sqrt(dot(gb, gb, params) / dot(g["args"], g["args"], params))}
        for opt in a.optimizers.split(","):
            if opt == "sgd" and sgd_lr is None:  # set on the unrouted row
                sgd_lr = a.sgd_gain / row["norm_args"] ** 2
            lr = a.lr if opt == "adam" else sgd_lr
            row[opt] = {"lr": lr, **step_effect(params, gb, opt, lr, measure, at_start)}
            if opt == "sgd":  # first order: ΔL = −lr⟨∇L, step gradient⟩
                row[opt]["first_order_L_act"] = -lr * dot(g["act"], gb, params)
                row[opt]["first_order_L_args"] = -lr * dot(g["args"], gb, params)
            if rule is None:  # the scale: the same optimizer's action-only step, on the action objective
                row[opt]["act_step"] = step_effect(params, ga, opt, lr, measure, at_start)
        rows.append(row)
        eff = "  ".join(f"{o}: Δlogp_act {row[o]['logp_act']:+.2e} ΔL_act {row[o]['L_act']:+.2e} ΔL_args {row[o]['L_args']:+.2e}"
                        for o in a.optimizers.split(","))
        print(f"{row['rule']:>15} {remainder or '':>6} γ={gamma if gamma is not None else '':<4} cos all {row['cos']['all']:+.3f} "
              f"layers {row['cos'].get('layers', float('nan')):+.3f} embed {row['cos'].get('embed', float('nan')):+.3f}  {eff}",
              flush=True)
    result = {"label": a.label, "model": a.model, "db": str(a.db), "run": a.run, "retokenized": a.retokenize,
              "samples": n, "groups": len({s.group_id for s in data.samples}), "tokens": tokens,
              "action_tokens": int(act.sum()), "args_tokens": int(args_.sum()), "rho": a.rho, "adam_lr": a.lr,
              "sgd_lr": sgd_lr, "fwd_two_bwd_s": fwd_bwd, "seconds": time.perf_counter() - t0,
              "date": time.strftime("%Y-%m-%d"), "commit": _commit(), "reference": reference, "settings": rows}
    a.json.parent.mkdir(parents=True, exist_ok=True)
    with a.json.open("a") as f:
        f.write(json.dumps(result) + "\n")
    print(f"{result['seconds']:.0f} s; appended to {a.json}")


def table(r: dict) -> str:
    """A result line as a markdown table: per setting the cosines and the args-only step's effect on the
    action (ΔL_act as a share of the step's own gain −ΔL_args; Δ mean log-prob of the action tokens)."""
    opts = [o for o in ("adam", "sgd") if o in r["settings"][0]]
    head = ["setting", "cos updates (all)", "cos updates (layers)", "cos(∇L_act, args update)", "args kept"]
    for o in opts:
        head += [f"{o}: ΔL_act ÷ −ΔL_args", f"{o}: Δ logp act"]
    lines = [f"{r['label']}: {r['samples']} samples ({r['groups']} groups), {r['tokens']} tokens, {r['action_tokens']} "
             f"action / {r['args_tokens']} args tokens; Adam lr {r['adam_lr']:g}, SGD lr {r.get('sgd_lr') or 0:.3g}",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in r["settings"]:
        name = "off" if s["rule"] == "off" else f"{s['rule']}, {s['remainder']}, γ {s['gamma']:g}"
        cells = [name, f"{s['cos']['all']:+.3f}", f"{s['cos'].get('layers', float('nan')):+.3f}",
                 f"{s['cos_erosion']['all']:+.3f}", f"{s['kept_args']:.2f}"]
        for o in opts:
            e = s[o]
            cells += [f"{e['L_act'] / -e['L_args']:+.3f}" if e["L_args"] < 0 else f"{e['L_act']:+.1e} (ΔL_args {e['L_args']:+.1e})",
                      f"{e['logp_act']:+.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    off = r["settings"][0]
    for o in opts:
        if "act_step" in off[o]:
            lines.append(f"\n{o}, scale: an action-only step at the same lr moves L_act by {off[o]['act_step']['L_act']:+.2e} and "
                         f"the action log-prob by {off[o]['act_step']['logp_act']:+.1e} (|Δ| {off[o]['act_step']['abs_dlogp_act']:.1e}); "
                         f"the args-only step: L_act {off[o]['L_act']:+.2e}, L_args {off[o]['L_args']:+.2e}, |Δ logp act| {off[o]['abs_dlogp_act']:.1e}")
    ref = r.get("reference") or {}
    if ref:
        lines.append("\nreference cosines (two halves of the groups): " + ", ".join(
            f"{k} {v['all']:+.3f} (layers {v.get('layers', float('nan')):+.3f})" for k, v in ref.items()))
    return "\n".join(lines)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


if __name__ == "__main__":
    main()
