"""bench/learning.py's reporting (its statistics in bench/learning_stats.py): Wilson intervals,
the verdicts (against the warm start and between algorithms, pooled and paired by seed), and
`--report-only` rendering the table, verdicts and plot from a results.json without training."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPT = BENCH / "learning.py"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _learning():
    return _load("bench_learning", SCRIPT)


def _stats():
    return _load("bench_learning_stats", BENCH / "learning_stats.py")


def test_wilson_at_the_edges_and_the_middle():
    wilson = _stats().wilson
    # p = 0: the interval is [0, z²/(n + z²)]; p = 1 mirrors it (worked out from the formula)
    assert wilson(0.0, 64) == pytest.approx((0.0, 3.8416 / 67.8416))
    assert wilson(1.0, 64) == pytest.approx((64 / 67.8416, 1.0))
    # p = 0.5, n = 100: centre 0.5, half-width 1.96·√(0.0025 + 3.8416/40000) / 1.038416 = 0.09617
    assert wilson(0.5, 100) == pytest.approx((0.40383, 0.59617), abs=1e-5)
    assert all(math.isnan(x) for x in wilson(0.5, 0))


def test_verdicts_against_the_warm_start_and_between_algorithms():
    stats = _stats()
    warm = (0.3, 0.2, 0.4)
    summary = {"grpo": {"before": warm, "after": (0.6, 0.5, 0.7)},
               "capo": {"before": warm, "after": (0.3, 0.2, 0.4)},
               "matpo": {"before": warm, "after": (0.45, 0.35, 0.55)},
               "pact": {"before": warm, "after": (0.8, 0.72, 0.88)}}
    assert stats.verdicts(summary) == [
        "grpo: above the warm start",              # 0.5 > 0.4
        "capo: not separated from the warm start",  # the same interval
        "matpo: not separated from the warm start",  # 0.35 < 0.4: overlaps
        "pact: above the warm start",
        "grpo vs capo: grpo above capo",            # 0.5 > 0.4
        "grpo vs matpo: not separated",             # 0.5 < 0.55
        "grpo vs pact: grpo below pact",            # 0.7 < 0.72
        "capo vs matpo: not separated",
        "capo vs pact: capo below pact",
        "matpo vs pact: matpo below pact",          # 0.55 < 0.72
    ]
    assert stats.compare((0.5, 0.4, 0.6), (0.2, 0.1, 0.3)) == "above"
    assert stats.compare((0.5, 0.4, 0.6), (0.6, 0.6, 0.7)) == "not separated"  # touching ends overlap


def test_report_only_renders_from_a_results_file(tmp_path):
    # three seeds × 64 held-out tasks: 192 pooled outcomes, so grpo's 0.25 → 0.75 is
    # [0.19, 0.32] → [0.68, 0.81] (apart) and validity 1.0 has an upper end a rounding error
    # below 1 (the plot must not turn that into a negative error bar)
    def run(seed, after, curve):
        # the skills apart: grpo's right tool 0.5 → 0.75 ([0.43, 0.57] → [0.68, 0.81], apart), its
        # right item 0.5 → 0.5
        return {"seed": seed, "before": 0.25, "after": after, "validity_before": 1.0, "validity_after": 1.0,
                "curve": curve, "train": [0.3, 0.4], "seconds": 100.0,
                "parts_before": {"right_tool": 0.5, "right_item": 0.5},
                "parts_after": {"right_tool": after if after > 0.5 else 0.5, "right_item": 0.5}}

    results = {"args": {"rounds": 2, "group": 4, "temperature": 0.7, "steps": 8, "batch_size": 32, "lr": 1e-4},
               "harness": "toolbox", "n_eval": 64,
               "runs": {"grpo": [run(s, 0.75, [0.5, 0.75]) for s in range(3)],
                        "capo": [run(s, 0.25, [0.25, 0.25]) for s in range(3)]}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    wide = {**os.environ, "COLUMNS": "250"}  # a table wide enough that no cell wraps
    done = subprocess.run([sys.executable, str(SCRIPT), "--report-only", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=wide)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "0.250 [0.19, 0.32]" in out and "0.750 [0.68, 0.81]" in out and "0.50 0.75" in out
    for line in ("grpo: above the warm start", "capo: not separated from the warm start",
                 "grpo vs capo: grpo above capo", "grpo: right tool (action) above the warm start",
                 "grpo: right item (args) not separated from the warm start",
                 "capo: right tool (action) not separated from the warm start"):
        assert line in out
    assert "0.500 [0.43, 0.57]" in out
    # the per-seed pairs: every seed's warm start and each algorithm's result on it
    assert "per seed: held-out success" in out
    assert all(re.search(rf"│ {s}\s+│ 0\.250\s+│ 0\.750\s+│ 0\.250\s+│", out) for s in range(3))
    # the same +0.5 on each of 3 seeds: the exact sign-flip p 2/8 = 0.25 (not 0), twice (grpo − warm start
    # too), beside capo's 1.0: Holm 3·0.25 = 0.75 — 3 seeds cannot separate anything
    assert "grpo − capo: +0.500 [+0.50, +0.50] per seed, Holm p 0.750 of 3, not separated (higher on 3, lower on 0 of 3 seeds)" in out
    png = (tmp_path / "learning.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert not (tmp_path / "tiny").exists()  # nothing was built or trained


def test_the_warm_start_sees_every_item_and_half_of_them_with_both_training_attributes():
    from harnessrl.harness_examples.toolbox import tasks as toolbox

    share = _learning().sft_share
    train, held = toolbox.generate(0)
    mixed = share(train, 16)
    # 16 items × 2 training attributes + 16 items × their first one: 48 tasks, all 32 items, and 16
    # of RL's 64 training tasks ask an attribute the warm start never saw with that item
    per_item = {i: sum(t.item == i for t in mixed) for i in {t.item for t in train}}
    assert len(mixed) == 48 and sorted(per_item.values()) == [1] * 16 + [2] * 16
    assert {t.id for t in mixed} < {t.id for t in train}
    once = {t.item for t in mixed if per_item[t.item] == 1}
    firsts = [next(t for t in train if t.item == i) for i in once]  # the first of each in task order
    assert {t.id for t in firsts} <= {t.id for t in mixed}
    half = share(train, 16, others_once=False)
    # without the others: 16 items × 2, the other 16 items never written by the warm start
    assert len(half) == 32 and len({t.item for t in half}) == 16
    assert share(train, 32) == train == share(train, 32, others_once=False)
    assert not {t.id for t in mixed} & {t.id for t in held}


def test_the_warm_start_data_is_the_inconsistent_experts_lines_and_the_copy_drill():
    import argparse

    from harnessrl.harness_examples.toolbox import tasks as toolbox

    learning = _learning()
    assert learning.confusions("size:color,owner:city") == {"size": "color", "owner": "city"}
    assert learning.confusions("none") == {}
    with pytest.raises(SystemExit, match="--confuse"):
        learning.confusions("size")
    train, _ = toolbox.generate(0)
    args = argparse.Namespace(confuse="size:color", expert_traces=3, expert_right=1, copy_drill=2)
    rows = learning.warm_start_rows(train, toolbox.world(0), args)
    drill = [r for r in rows if r["meta"]["harness"] == "copy-drill"]
    assert len(rows) == 3 * 64 + len(drill) and len(drill) == 2 * 2 * len(toolbox.ITEMS)
    sizes = [r for r in rows if r["meta"].get("attribute") == "size"]
    called = [r["expert_trace"][0]["tool_calls"][0]["function"]["name"] for r in sizes]
    assert len(sizes) == 3 * sum(t.attribute == "size" for t in train) and called.count("get_size") * 3 == len(called)
    with pytest.raises(SystemExit, match="--confuse"):
        learning.warm_start_rows(train, toolbox.world(0), argparse.Namespace(**{**vars(args), "confuse": "size:mass"}))


def test_paired_by_seed_by_hand():
    stats = _stats()
    # diffs 0.1, 0.3, 0.2: mean 0.2, sd 0.1, se 0.1/√3 = 0.05774; t(0.975, 2 df) = 4.3027 → ± 0.2484
    m, lo, hi = stats.paired([0.1, 0.3, 0.2])
    assert m == pytest.approx(0.2) and lo == pytest.approx(-0.0484, abs=1e-4) and hi == pytest.approx(0.4484, abs=1e-4)
    runs = {"grpo": [{"seed": s, "before": b, "after": a} for s, b, a in ((0, 0.2, 0.5), (1, 0.3, 0.6), (2, 0.4, 0.7))],
            "capo": [{"seed": s, "before": b, "after": a} for s, b, a in ((2, 0.4, 0.8), (0, 0.2, 0.6), (1, 0.3, 0.5))]}
    # p-values, Holm-adjusted over the 3 comparisons (t on 2 df: sf(t) = 1/2 − t / (2√(t² + 2)))
    assert stats.seed_verdicts(runs) == [
        # the same gain on every seed: no spread for t, the exact sign-flip p 2/2³ = 0.25; second smallest:
        # × 2 = 0.5
        "grpo − warm start: +0.300 [+0.30, +0.30] per seed, Holm p 0.500 of 3, not separated (higher on 3, lower on 0 of 3 seeds)",
        # 0.4, 0.4, 0.2: mean 0.333, sd 0.1155, se 0.0667, ± 0.287; t = 5, p = 1 − 5/√27 = 0.0377,
        # smallest: × 3 = 0.113 — its own interval excludes 0, the correction does not let it count
        "capo − warm start: +0.333 [+0.05, +0.62] per seed, Holm p 0.113 of 3, not separated (higher on 3, lower on 0 of 3 seeds)",
        # paired by seed: -0.1, +0.1, -0.1; t = 0.5, p = 1 − 0.5/1.5 = 0.667
        "grpo − capo: -0.033 [-0.32, +0.25] per seed, Holm p 0.667 of 3, not separated (higher on 1, lower on 2 of 3 seeds)",
    ]


def test_rl_on_fewer_tasks_keeps_every_item_and_the_loop_splits_the_file_back(tmp_path):
    from harnessrl.app.rollouts.harnesses import TaskSource, load_harness
    from harnessrl.harness_examples.toolbox import tasks as toolbox

    rl_tasks = _learning().rl_tasks
    train, held = toolbox.generate(1)
    firsts = rl_tasks(train, 32)
    # one task per item, each the first of its item in task order
    assert len(firsts) == 32 and len({t.item for t in firsts}) == 32
    assert all(next(u for u in train if u.item == t.item) == t for t in firsts)
    more = rl_tasks(train, 40)
    assert more[:32] == firsts and len({t.item for t in more[32:]}) == 8 and not set(more[32:]) & set(firsts)
    assert sorted(t.id for t in rl_tasks(train, 64)) == sorted(t.id for t in train)
    # what bench/learning.py hands the loop: the subset, then the held-out tasks, and the fraction
    # that puts exactly the held-out ones on the evaluation side
    path = toolbox.write(firsts + held, tmp_path / "tasks.jsonl")
    h = load_harness("toolbox", TaskSource(path, None, tmp_path, None, len(held) / (32 + len(held)), 1))
    assert [t.id for t in h.train] == [t.id for t in firsts] and [t.id for t in h.eval] == [t.id for t in held]


def test_a_benchmark_trained_in_parts_keeps_the_other_algorithms_runs(tmp_path):
    write = _learning()._write_results
    path = tmp_path / "results.json"
    args = {"algos": "grpo,capo", "lr": 2e-4}
    write(path, {"args": dict(args), "runs": {"grpo": [1], "capo": [2]}, "wall_s": 100.0})
    write(path, {"args": {**args, "algos": "matpo,pact"}, "runs": {"matpo": [3], "pact": [4]}, "wall_s": 50.0})
    both = json.loads(path.read_text())
    assert both["runs"] == {"grpo": [1], "capo": [2], "matpo": [3], "pact": [4]}
    assert both["args"]["algos"] == "grpo,capo,matpo,pact" and both["wall_s"] == 150.0
    # the same algorithm again replaces its runs; the wall time is of every part that ran
    write(path, {"args": {**args, "algos": "pact"}, "runs": {"pact": [5]}, "wall_s": 20.0})
    assert json.loads(path.read_text())["runs"]["pact"] == [5] and json.loads(path.read_text())["wall_s"] == 170.0
    # other settings: nothing of the earlier run is kept
    write(path, {"args": {**args, "lr": 1e-3, "algos": "grpo"}, "runs": {"grpo": [6]}, "wall_s": 10.0})
    assert json.loads(path.read_text()) == {"args": {**args, "lr": 1e-3, "algos": "grpo"}, "runs": {"grpo": [6]},
                                            "wall_s": 10.0}


def test_seeds_an_earlier_run_finished_with_the_same_settings_are_kept_not_trained(tmp_path, monkeypatch):
    """A run cut short resumes: a seed whose per-seed results.json has the run's settings is read
    back (no process started for it), and the merged results name it as reused; a seed of other
    settings is trained again."""
    learning = _learning()

    def seed_results(seed: int, *flags: str) -> None:
        child = learning.parse_args(["--seeds", str(seed), "--algos", "grpo", "--model", "base",
                                     "--out", str(tmp_path / f"seed-{seed}"), *flags])
        (tmp_path / f"seed-{seed}").mkdir(exist_ok=True)
        (tmp_path / f"seed-{seed}" / "results.json").write_text(json.dumps(
            {"args": learning._settings(child), "harness": "toolbox", "n_eval": 64,
             "runs": {"grpo": [{"seed": seed, "after": 0.5}]}}))

    started = []

    def train_one(cmd, **_):  # stands in for the per-seed process: records it, leaves its results
        started.append(int(cmd[cmd.index("--seeds") + 1]))
        seed_results(started[-1])
        return 0

    monkeypatch.setattr(subprocess, "call", train_one)
    seed_results(0)
    seed_results(1, "--lr", "1e-3")  # an earlier run with another learning rate
    learning._train_parallel(learning.parse_args(["--seeds", "0,1", "--algos", "grpo", "--model", "base",
                                                  "--out", str(tmp_path)]))
    merged = json.loads((tmp_path / "results.json").read_text())
    assert started == [1] and merged["reused"] == [0]
    assert [r["seed"] for r in merged["runs"]["grpo"]] == [0, 1]


def test_runs_sharing_a_warm_cache_fit_each_warm_start_once(tmp_path):
    # bench/fair.py starts one learning.py per (algorithm, lr, seed) with one --warm-cache: the
    # same seed's warm start is fitted by the first and reused by the others, also when they ask at once
    import threading
    import time as clock
    from types import SimpleNamespace

    learning = _learning()
    tasks = tmp_path / "sft.jsonl"
    tasks.write_text('{"x": 1}\n')
    fitted = []

    def sft(cfg):
        fitted.append(cfg.out)
        clock.sleep(0.3)  # long enough that the second caller arrives while the first fits
        (Path(cfg.out) / "final").mkdir(parents=True)
        return Path(cfg.out) / "final"

    def cfg():
        return SimpleNamespace(model="m", steps=10, lr=1e-3, seed=0, tasks=str(tasks), out="")

    got = []
    threads = [threading.Thread(target=lambda: got.append(learning.warm_start(tmp_path / "cache" / "warm-0", cfg(), sft)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fitted) == 1 and len(set(got)) == 1 and got[0].is_dir()
    # other settings: fitted again
    other = cfg()
    other.steps = 20
    learning.warm_start(tmp_path / "cache" / "warm-0", other, sft)
    assert len(fitted) == 2
