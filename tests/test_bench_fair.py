"""bench/fair.py without training: the paired t-test and Holm's adjustment against numbers worked
out by hand, the plan (the same grid and tuning seeds for every algorithm, the lr chosen on
validation, the report on other seeds), and the report read from a ledger."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_holm_by_hand():
    holm = _load("learning_stats").holm
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 → kept monotone: 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.2]) == pytest.approx([0.2])


def test_paired_t_test_by_hand():
    paired_test = _load("learning_stats").paired_test
    # diffs 0.1, 0.2, 0, 0.1: mean 0.1, sd √(0.02/3) = 0.08165, se 0.040825, t = 2.4495 on 3 df
    # (two-sided p 0.0917), half-width t.975(3) = 3.1824 × 0.040825 = 0.12992
    mean, lo, hi, p = paired_test([0.1, 0.2, 0.0, 0.1])
    assert (mean, lo, hi) == pytest.approx((0.1, 0.1 - 0.12992, 0.1 + 0.12992), abs=1e-4)
    assert p == pytest.approx(0.0917, abs=5e-4)
    assert paired_test([0.0, 0.0, 0.0])[3] == 1.0
    # every difference equal and not 0: t is infinite, but no test on 3 pairs gives p = 0; the exact
    # sign-flip p is 2 of the 8 sign patterns (+++, −−−) two-sided, 1/8 one-sided
    assert paired_test([0.1, 0.1, 0.1])[3] == pytest.approx(2 / 8)
    assert paired_test([0.1, 0.1, 0.1], "greater")[3] == pytest.approx(1 / 8)
    assert paired_test([0.1, 0.1, 0.1], "less")[3] == pytest.approx(1.0)
    assert paired_test([-0.2] * 6, "less")[3] == pytest.approx(1 / 64)
    # one-sided t: t = 2.4495 on 3 df, P(T ≥ t) = 0.0917 / 2
    assert paired_test([0.1, 0.2, 0.0, 0.1], "greater")[3] == pytest.approx(0.0917 / 2, abs=3e-4)
    assert paired_test([0.1, 0.2, 0.0, 0.1], "less")[3] == pytest.approx(1 - 0.0917 / 2, abs=3e-4)
    with pytest.raises(ValueError, match="alternative"):
        paired_test([0.1, 0.2], "bigger")


def test_sign_flip_test_by_hand():
    sign_flip = _load("learning_stats").sign_flip_test
    # diffs 0.1, 0.2, 0, 0.1 (sum 0.4): the 16 patterns' sums are ±0.1 ± 0.2 ± 0.1, each twice (the 0
    # flips to itself): 0.4, 0.2, 0.2, 0, 0, −0.2, −0.2, −0.4. |sum| ≥ 0.4: 2 of 8 → 0.25; sum ≥ 0.4: 1/8
    assert sign_flip([0.1, 0.2, 0.0, 0.1]) == pytest.approx(0.25)
    assert sign_flip([0.1, 0.2, 0.0, 0.1], "greater") == pytest.approx(0.125)
    # sum ≤ 0.4: all but none → 1
    assert sign_flip([0.1, 0.2, 0.0, 0.1], "less") == pytest.approx(1.0)
    # 6 equal pairs, the floor: 2/64 = 0.03125 two-sided, 1/64 one-sided
    assert sign_flip([0.5] * 6) == pytest.approx(0.03125)
    assert sign_flip([0.5] * 6, "greater") == pytest.approx(1 / 64)
    # 3, −1, 2 (sum 4): the 8 patterns' sums 4, 0, 6, 2, −2, −6, 0, −4 → |s| ≥ 4: 4 of 8; s ≥ 4: 2 of 8
    assert sign_flip([3.0, -1.0, 2.0]) == pytest.approx(0.5)
    assert sign_flip([3.0, -1.0, 2.0], "greater") == pytest.approx(2 / 8)
    assert sign_flip([0.0, 0.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="exact enumeration"):
        sign_flip([0.1] * 21)


def _args(fair, tmp_path, *more):
    return fair.parse_args(["--families", "capo-multihop", "--algos", "grpo,capo", "--grid", "1e-4,2e-4",
                            "--tune-seeds", "100,101", "--seeds", "0,1,2", "--ledger", str(tmp_path / "l.jsonl"), *more])


def _line(fair, stage, family, algo, lr, seed, before, after):
    """A ledger line of the benchmark's own run (fair.RUN and the family's flags, none passed through)."""
    flags = fair.run_flags(family, [])
    return {"key": fair.Ledger.key(stage, family, algo, lr, seed, flags), "stage": stage, "family": family,
            "algo": algo, "lr": lr, "seed": seed, "extra": flags, "seconds": 60.0, "before": before, "after": after}


def _tuned(fair, args, ledger, after=lambda lr: 0.4):
    """The tuning stage's lines for every family and algorithm of `args`: validation `after(lr)`."""
    for family in args.families:
        for algo in args.algos:
            for lr in args.grid:
                for seed in args.tune_seeds:
                    ledger.add(_line(fair, "tune", family, algo, lr, seed, 0.2, after(lr)))


def test_the_grid_is_tuned_on_validation_seeds_and_reported_on_the_others(tmp_path):
    fair = _load("fair")
    args = _args(fair, tmp_path)
    ledger = fair.Ledger(args.ledger)
    tune = fair.planned(args, ledger, "tune")
    # every algorithm: both lrs × both tuning seeds; no report run before the tuning is finished
    assert sorted(tune) == sorted(("tune", "capo-multihop", a, lr, s) for a in ("grpo", "capo")
                                  for lr in (1e-4, 2e-4) for s in (100, 101))
    assert fair.planned(args, ledger, "report") == []
    after = {("grpo", 1e-4): (0.5, 0.6), ("grpo", 2e-4): (0.7, 0.6), ("capo", 1e-4): (0.4, 0.4), ("capo", 2e-4): (0.3, 0.5)}
    for (algo, lr), values in after.items():
        for seed, v in zip((100, 101), values):
            ledger.add(_line(fair, "tune", "capo-multihop", algo, lr, seed, 0.3, v))
    assert fair.chosen_lr(args, ledger, "capo-multihop", "grpo") == 2e-4  # mean 0.65 over 0.55
    assert fair.chosen_lr(args, ledger, "capo-multihop", "capo") == 1e-4  # a tie (0.4, 0.4) goes to the earlier
    assert sorted(fair.planned(args, ledger, "report")) == sorted(
        [("report", "capo-multihop", "grpo", 2e-4, s) for s in (0, 1, 2)]
        + [("report", "capo-multihop", "capo", 1e-4, s) for s in (0, 1, 2)])
    # the ledger is the file: a new process sees what was run
    assert len(fair.Ledger(args.ledger).lines) == 8
    # flags passed through to learning.py are part of the key: other settings, other runs
    assert len(fair.planned(_args(fair, tmp_path, "--", "--rounds", "2"), ledger, "tune")) == 8


def test_a_family_s_own_flags_key_its_runs_only(tmp_path):
    """capo-multihop runs with its expert's relation wrong on 5 lines of 7 (--expert-right 2,5, its
    relation word's say), a flag in its lines' keys; the other families' keys hold RUN alone, so
    their runs made before the flag are kept."""
    fair = _load("fair")
    assert fair.run_flags("capo-multihop", ["--beta", "0"]) == [*fair.RUN, "--expert-right", "2,5", "--beta", "0"]
    assert fair.run_flags("pact-sparse", []) == fair.RUN
    args = _args(fair, tmp_path, "--families", "capo-multihop,pact-sparse")
    ledger = fair.Ledger(args.ledger)
    for algo in ("grpo", "capo"):
        for lr in args.grid:
            for seed in args.tune_seeds:
                ledger.add({**_line(fair, "tune", "pact-sparse", algo, lr, seed, 0.0, 0.0),
                            "key": fair.Ledger.key("tune", "pact-sparse", algo, lr, seed, fair.RUN)})
                old = fair.Ledger.key("tune", "capo-multihop", algo, lr, seed, fair.RUN)
                ledger.add({**_line(fair, "tune", "capo-multihop", algo, lr, seed, 0.0, 0.0), "key": old})
    assert {run[1] for run in fair.planned(args, ledger, "tune")} == {"capo-multihop"}
    assert len(fair.planned(args, ledger, "tune")) == 8


def test_tuning_and_report_seeds_must_differ(tmp_path):
    fair = _load("fair")
    with pytest.raises(SystemExit, match="share a seed"):
        fair.parse_args(["--tune-seeds", "0,9", "--seeds", "0,1"])


def test_the_report_pairs_by_seed_and_corrects_over_the_comparisons(tmp_path):
    from rich.console import Console

    fair = _load("fair")
    args = _args(fair, tmp_path, "--families", "capo-multihop,pact-sparse", "--algos", "grpo,capo,pact")
    ledger = fair.Ledger(args.ledger)
    _tuned(fair, args, ledger, lambda lr: 0.5 if lr == 1e-4 else 0.4)
    report = {("capo-multihop", "grpo"): [0.50, 0.55, 0.60], ("capo-multihop", "capo"): [0.60, 0.66, 0.69],
              ("capo-multihop", "pact"): [0.40, 0.60, 0.50],
              ("pact-sparse", "grpo"): [0.10, 0.10, 0.20], ("pact-sparse", "capo"): [0.10, 0.10, 0.20],
              ("pact-sparse", "pact"): [0.00, 0.10, 0.10]}
    for (family, algo), values in report.items():
        for seed, v in zip(args.seeds, values):
            line = _line(fair, "report", family, algo, 1e-4, seed, 0.2, v)
            ledger.add({**line, "group_success": [0.1 * (seed + 1), 0.5], "diagnostics": {"kl": 0.01 * seed, "other": 1}})
    cs = {(c["family"], c["algo"]): c for c in fair.comparisons(args, ledger)}
    # capo − grpo on capo-multihop: diffs 0.10, 0.11, 0.09; mean 0.10, sd 0.01, t = 17.32 on 2 df, p = 0.00332
    c = cs[("capo-multihop", "capo")]
    assert c["diffs"] == pytest.approx([0.10, 0.11, 0.09])
    assert c["p"] == pytest.approx(0.00332, abs=2e-5)
    # four comparisons; it has the smallest p (the all-zero pact-sparse capo one has p 1): × 4
    assert len(cs) == 4
    assert c["p_holm"] == pytest.approx(4 * c["p"], rel=1e-6)
    assert cs[("pact-sparse", "capo")]["p"] == 1.0
    assert fair.verdict(c) == "above"
    console = Console(record=True, width=200)
    fair.report(args, ledger, console)
    text = console.export_text()
    assert "capo's claim (above grpo on capo-multihop): holds" in text
    # pact − grpo on pact-sparse: diffs −0.1, 0, −0.1: not separated after correction
    assert "pact's claim (above grpo on pact-sparse): not shown" in text
    assert "matpo's claim (above grpo on matpo-delegate): not measured yet" in text
    # the reasons beside: round-1 groups with a success (0.1, 0.2, 0.3 → 0.20), the trainer's KL (0, 0.01, 0.02)
    assert "pact-sparse: why" in text and "groups with a success, round 1" in text
    assert any(line.split()[:3] == ["│", "pact", "│"] and "0.20" in line and "0.01" in line for line in text.splitlines())
    assert json.loads(Path(args.ledger).read_text().splitlines()[0])["stage"] == "tune"


def test_the_report_can_use_the_exact_one_sided_sign_flip_test(tmp_path):
    from rich.console import Console

    fair = _load("fair")
    args = _args(fair, tmp_path, "--families", "capo-multihop", "--algos", "grpo,capo", "--test", "sign-flip",
                 "--alternative", "greater")
    ledger = fair.Ledger(args.ledger)
    _tuned(fair, args, ledger)
    for algo, values in {"grpo": [0.50, 0.55, 0.60], "capo": [0.60, 0.66, 0.69]}.items():
        for seed, v in zip(args.seeds, values):
            ledger.add(_line(fair, "report", "capo-multihop", algo, 1e-4, seed, 0.2, v))
    (c,) = fair.comparisons(args, ledger)
    # diffs 0.10, 0.11, 0.09, all above: the t-test's p 0.00332 two-sided, but the exact one-sided
    # sign-flip p is 1/2³ = 0.125, its floor on 3 seeds: the claim is not shown
    assert c["p"] == pytest.approx(0.125) and c["p_holm"] == pytest.approx(0.125)
    assert fair.verdict(c) == "not separated"
    console = Console(record=True, width=200)
    fair.report(args, ledger, console)
    text = console.export_text()
    assert "(sign-flip test, greater)" in text and "capo's claim (above grpo on capo-multihop): not shown" in text
    # one-sided: a small p below the baseline can never read as "below"
    assert fair.verdict({"p_holm": 0.01, "mean": -0.2, "alternative": "greater"}) == "not separated"


def test_a_family_s_fingerprint_covers_its_own_modules_only(tmp_path):
    """A change to matpo-delegate's noisy tools starts its runs again and keeps the other families'."""
    import shutil

    root = BENCH.parent
    shutil.copytree(BENCH, tmp_path / "bench", ignore=shutil.ignore_patterns("results", "__pycache__"))
    shutil.copytree(root / "harness_examples" / "toolbox", tmp_path / "harness_examples" / "toolbox",
                    ignore=shutil.ignore_patterns("__pycache__"))

    def codes():
        spec = importlib.util.spec_from_file_location("bench_fair_copy", tmp_path / "bench" / "fair.py")
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(tmp_path / "bench"))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(tmp_path / "bench"))
        return module.TASKS_CODE

    sys.path.insert(0, str(BENCH))
    try:
        families = importlib.import_module("learning_families").FAMILIES
    finally:
        sys.path.remove(str(BENCH))
    before = codes()
    assert set(before) == set(families) and len(set(before.values())) == len(families)
    noisy = tmp_path / "harness_examples" / "toolbox" / "noisy_delegate.py"
    noisy.write_text(noisy.read_text() + "\n# changed\n")
    after = codes()
    assert after["matpo-delegate"] != before["matpo-delegate"]
    assert {f: after[f] for f in families if f != "matpo-delegate"} == {f: before[f] for f in families
                                                                       if f != "matpo-delegate"}
    hop = tmp_path / "harness_examples" / "toolbox" / "multihop.py"  # both two-hop families are made of it
    hop.write_text(hop.read_text() + "\n# changed\n")
    again = codes()
    assert again["capo-multihop"] != after["capo-multihop"] and again["matpo-delegate"] != after["matpo-delegate"]
    assert again["pact-sparse"] == before["pact-sparse"] and again["toolbox"] == before["toolbox"]
    shared = tmp_path / "bench" / "learning_warm.py"  # the warm start belongs to every family
    shared.write_text(shared.read_text() + "\n# changed\n")
    assert not set(codes().values()) & set(again.values())


def test_the_per_seed_table_shows_each_algorithm_s_warm_start_where_they_differ(tmp_path):
    """matpo-delegate's single agent (GRPO) starts from a warm start of its own: one "warm start"
    column would show GRPO's as MATPO's."""
    from rich.console import Console

    fair = _load("fair")
    args = _args(fair, tmp_path, "--families", "matpo-delegate,pact-sparse", "--algos", "grpo,matpo")
    ledger = fair.Ledger(args.ledger)
    _tuned(fair, args, ledger)
    for family in args.families:
        for algo in args.algos:
            for seed in args.seeds:
                before = 0.375 if (family, algo) == ("matpo-delegate", "grpo") else 0.042
                ledger.add(_line(fair, "report", family, algo, 1e-4, seed, before, before + 0.1))
    console = Console(record=True, width=200)
    fair.report(args, ledger, console)
    text = console.export_text()
    delegate, sparse = text.split("held-out success per seed")[1:3]
    heads = [line for line in text.splitlines() if line.startswith("┃ seed")]
    assert "warm start" not in heads[0] and "warm start" in heads[1]
    assert "0.375 → 0.475" in delegate and "0.042 → 0.142" in delegate
    assert "→" not in sparse.split("each algorithm")[0].split("RL (lr")[1]  # one warm start a seed: its column
