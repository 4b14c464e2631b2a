"""Advantage estimators' math (docs/methods.md §5). Pure functions over per-rollout / per-unit rewards;
`estimators.py` maps compiled rollouts onto them.

Every normalisation is `(x − mean) / (std + eps)` over a group. A group (or bucket) of one has
no baseline: its advantage is 0 by default (`singleton="zero"`), or its raw value with mean 0
and std 1 (`singleton="raw"`); each such group is counted in `counts` when one is given.
`std` is the unbiased sample std by default (`population` on request).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Hashable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from harnessrl.errors import UserError

_CHOICES = {"std": ("sample", "population"), "proc_norm": ("index", "all"), "singleton": ("zero", "raw"),
            "matpo_norm": ("turns", "planner")}


@dataclass(frozen=True)
class AdvantageConfig:
    std: str = "sample"  # sample (ddof 1) | population (ddof 0)
    eps: float = 1e-6
    lambda_proc: float = 0.1  # harness: weight of the normalised process reward
    proc_norm: str = "index"  # harness: normalise units with the same agent and index | "all" the group's units
    matpo_acc: float = 0.9  # matpo: R = acc_w·acc + fmt_w·(½ fmt_p + ½ fmt_w)
    matpo_fmt: float = 0.1
    # matpo: "planner" (the paper's: Â among the G planner rollouts, broadcast to their workers) | "turns"
    # (departure: the G×(T+1) planner and worker rollouts, rollout i counted 1 + T_i times)
    matpo_norm: str = "planner"
    gamma: float = 0.9  # matchtir discount
    alpha: float = 1.0  # matchtir: 1 (paper) or 0.5 (reference code)
    lambda_pen: float = 0.0  # matchtir: reward of an unmatched predicted call is −λ_pen
    singleton: str = "zero"  # a group or bucket of one: advantage 0 | its raw value (mean 0, std 1)

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise UserError(f"advantage config {name}={getattr(self, name)!r}: use {' or '.join(allowed)}")

    def as_dict(self) -> dict[str, float | str]:
        return asdict(self)


def load_adv_config(path: Path | None, **overrides) -> AdvantageConfig:
    """An AdvantageConfig from a YAML/JSON file of field: value, then `overrides` (not None)."""
    values: dict = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise UserError(f"--adv-config {path}: {exc.strerror}") from None
        import yaml

        is_json = str(path).endswith(".json")
        try:
            values = json.loads(text) if is_json else (yaml.safe_load(text) or {})
        except (ValueError, yaml.YAMLError) as exc:
            raise UserError(f"--adv-config {path}: not valid {'JSON' if is_json else 'YAML'}: "
                            f"{str(exc).splitlines()[0]}") from None
        if not isinstance(values, dict):
            raise UserError(f"--adv-config {path}: expected a mapping of field: value")
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name: f.type for f in fields(AdvantageConfig)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise UserError(f"--adv-config: unknown field {unknown[0]!r}: use {', '.join(known)}")
    for k, v in values.items():
        default = getattr(AdvantageConfig, k)
        if isinstance(default, float) and not (isinstance(v, (int, float)) and not isinstance(v, bool)):
            raise UserError(f"--adv-config: {k} must be a number, got {v!r}")
        if isinstance(default, float):
            values[k] = float(v)
    return AdvantageConfig(**values)


def normalize(values, cfg: AdvantageConfig = AdvantageConfig(), counts: Counter | None = None,
              kind: str = "singleton_groups") -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 1:
        if counts is not None:
            counts[kind] += 1
        if cfg.singleton == "zero":
            return np.zeros(1)
        mean, std = 0.0, 1.0
    else:
        mean, std = x.mean(), x.std(ddof=1 if cfg.std == "sample" else 0)
    return (x - mean) / (std + cfg.eps)


def _by_group(groups: dict[str, str], keys) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for k in keys:
        out[groups[k]].append(k)
    return out


def grpo(outcome: dict[str, float], groups: dict[str, str],
         cfg: AdvantageConfig = AdvantageConfig(), counts: Counter | None = None) -> dict[str, float]:
    """A_e: the rollout's outcome normalised over its group."""
    out: dict[str, float] = {}
    for members in _by_group(groups, outcome).values():
        for e, a in zip(members, normalize([outcome[e] for e in members], cfg, counts)):
            out[e] = float(a)
    return out


def harness(outcome: dict[str, float], groups: dict[str, str],
            units: dict[Hashable, tuple[str, str, int, float | None]],
            cfg: AdvantageConfig = AdvantageConfig(), counts: Counter | None = None) -> dict[Hashable, float]:
    """A_{e,j} = Â_e + λ_proc·Ã^proc_{e,j}. `units`: unit → (rollout, agent, index j, process
    reward or None). Ã^proc normalises r over the group's units with the same agent and j
    (or all the group's units); a unit without a process reward gets Ã = 0."""
    a_out = grpo(outcome, groups, cfg, counts)
    buckets: dict[tuple, list[Hashable]] = defaultdict(list)
    for u, (e, agent, j, r) in units.items():
        if r is not None:
            key = (groups[e], agent, j) if cfg.proc_norm == "index" else (groups[e],)
            buckets[key].append(u)
    proc: dict[Hashable, float] = {}
    for members in buckets.values():
        for u, v in zip(members, normalize([units[u][3] for u in members], cfg, counts, "singleton_buckets")):
            proc[u] = float(v)
    return {u: a_out[e] + cfg.lambda_proc * proc.get(u, 0.0) for u, (e, _, _, _) in units.items()}


def matpo_reward(acc: float, fmt_planner: float, fmt_workers: list[float],
                 cfg: AdvantageConfig = AdvantageConfig()) -> float:
    """R = 0.9·acc + 0.1·(0.5·fmt_p + 0.5·fmt_w), fmt_w the mean over worker sessions (0 if none)."""
    fmt_w = float(np.mean(fmt_workers)) if fmt_workers else 0.0
    return cfg.matpo_acc * acc + cfg.matpo_fmt * (0.5 * fmt_planner + 0.5 * fmt_w)


def matpo(acc: dict[str, float], fmt_planner: dict[str, float], fmt_workers: dict[str, list[float]],
          groups: dict[str, str], cfg: AdvantageConfig = AdvantageConfig(), counts: Counter | None = None,
          n_workers: dict[str, int] | None = None) -> dict[str, float]:
    """One scalar per rollout; the caller broadcasts it to the planner's and the workers' samples
    of that rollout. `matpo_norm="planner"` (the paper's objective and Implementation paragraph: Â
    "among G full rollouts", "among the group of planner-agent rollouts"): over the G planner
    rollouts. `"turns"` (a departure, from a loose summary sentence, "G×(T+1) rollouts"): mean and
    std over the planner rollouts and their worker rollouts, each worker rollout carrying its
    planner's reward, so rollout i weighs 1 + T_i (`n_workers`, default `len(fmt_workers[e])`)."""
    rewards = {e: matpo_reward(acc[e], fmt_planner[e], fmt_workers.get(e, []), cfg) for e in acc}
    if cfg.matpo_norm == "planner":
        return grpo(rewards, groups, cfg, counts)
    turns = {e: 1 + (n_workers[e] if n_workers is not None else len(fmt_workers.get(e, []))) for e in rewards}
    out: dict[str, float] = {}
    for members in _by_group(groups, rewards).values():
        expanded = [rewards[e] for e in members for _ in range(turns[e])]
        if len(members) == 1:  # one planner rollout: no baseline however many workers it had
            out[members[0]] = float(normalize([rewards[members[0]]], cfg, counts)[0])
            continue
        x = np.asarray(expanded)
        mean, std = x.mean(), x.std(ddof=1 if cfg.std == "sample" else 0)
        for e in members:
            out[e] = float((rewards[e] - mean) / (std + cfg.eps))
    return out


def discounted_returns(r: list[float], gamma: float) -> list[float]:
    """G_t = r_t + γ G_{t+1}."""
    out, g = [0.0] * len(r), 0.0
    for t in range(len(r) - 1, -1, -1):
        g = r[t] + gamma * g
        out[t] = g
    return out


def matchtir(turn_rewards: dict[str, list[float]], groups: dict[str, str],
             cfg: AdvantageConfig = AdvantageConfig(), counts: Counter | None = None) -> dict[str, list[float]]:
    """A_{k,t} = α(A^g_k + A^l_{k,t}): A^g from R_k = Σ_t r_{k,t} over the group, A^l from the
    discounted return G_{k,t} normalised over the group's rollouts that have a turn t."""
    a_g = grpo({k: float(sum(r)) for k, r in turn_rewards.items()}, groups, cfg, counts)
    returns = {k: discounted_returns(r, cfg.gamma) for k, r in turn_rewards.items()}
    a_l = {k: [0.0] * len(r) for k, r in turn_rewards.items()}
    for members in _by_group(groups, turn_rewards).values():
        for t in range(max(len(turn_rewards[k]) for k in members)):
            at_t = [k for k in members if t < len(returns[k])]
            for k, v in zip(at_t, normalize([returns[k][t] for k in at_t], cfg, counts, "singleton_buckets")):
                a_l[k][t] = float(v)
    return {k: [cfg.alpha * (a_g[k] + l) for l in a_l[k]] for k in turn_rewards}
