"""bench/async_loop.py's measures (bench/async_stats.py) and report (bench/async_report.py) on hand
numbers: the union of call intervals behind the inference idle fraction, a run's figures read
from a loop_state.json and a records DB, and the targets' verdicts."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_union_of_intervals_clipped_to_the_window():
    stats = _load("async_stats")
    # [0,2] ∪ [1,3] = 3 s, [5,6] 1 s, [2.5,2.8] inside the first, [9,12] clipped to [9,10]
    assert stats.union_seconds([(5, 6), (0, 2), (1, 3), (2.5, 2.8), (9, 12)], 0, 10) == pytest.approx(5.0)
    assert stats.union_seconds([(-3, 1), (11, 12)], 0, 10) == pytest.approx(1.0)
    assert stats.union_seconds([], 0, 10) == 0.0


def _db(path: Path, calls: list[tuple[float, float]], rollouts: list[tuple[str, str, float, float]]) -> None:
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE calls (created_at REAL, latency_ms REAL)")
        con.execute("CREATE TABLE rollouts (run TEXT, status TEXT, created_at REAL, finished_at REAL)")
        con.executemany("INSERT INTO calls VALUES (?, ?)", calls)
        con.executemany("INSERT INTO rollouts VALUES (?, ?, ?, ?)", rollouts)


def test_an_async_run_measured_from_its_state_and_records(tmp_path):
    stats = _load("async_stats")
    # the window: the first training rollout's start (100) to the last rollout's end (120, an eval);
    # calls in flight 100–102 and 101–104 (4 s), 110–111 (1 s), 95–96 (before it): 5 s busy of 20
    _db(tmp_path / "runs.db", [(100.0, 2000.0), (101.0, 3000.0), (110.0, 1000.0), (95.0, 1000.0), (None, None)],
        [("eval-initial", "finished", 90.0, 97.0), ("async-g0-a1", "finished", 100.0, 106.0),
         ("async-g1-a1", "finished", 101.0, 111.0), ("async-g2-a1", "failed", 112.0, 116.0),
         ("eval-s2-a1", "finished", 112.0, 120.0)])
    state = {"mode": "async", "initial_eval": 0.25,
             "steps": [{"samples": 8, "train_log": {"loss": 0.5, "mismatch/kl": 0.002}},
                       {"samples": 8, "train_log": {"loss": -0.1, "mismatch/kl": 0.004}}],
             "evals": [{"success": 0.5}, {"success": 0.75}],
             "totals": {"steps": 2, "train_s": 4.0, "mean_staleness": 0.5, "max_staleness": 1, "dropped_stale": 0}}
    (tmp_path / "loop_state.json").write_text(json.dumps(state))
    f = stats.measure(tmp_path, concurrency=2, n_eval=4)
    assert f["wall_s"] == 20.0 and f["inference_idle"] == pytest.approx(0.75)  # 1 − 5/20
    assert f["trainer_idle"] == pytest.approx(0.8)  # 1 − 4/20
    # training rollouts that finished, 6 s + 10 s (the evals' and the failed one left out) over 2 slots:
    # 8 s, above the trainer's 4 s
    assert (f["rollout_s"], f["rollouts"], f["bound_s"]) == (16.0, 2, 8.0)
    assert (f["held_out"], f["curve"], f["steps"], f["samples"], f["losses"]) == (0.75, [0.5, 0.75], 2, 16, [0.5, -0.1])
    assert f["mismatch_kl"] == pytest.approx(0.003)


def test_report_pairs_seeds_and_checks_the_targets(tmp_path):
    report = _load("async_report")

    def run(seed, mode, wall, train_s, held):
        return {"seed": seed, "wall_s": wall, "trainer_idle": 1 - train_s / wall, "inference_idle": 0.5,
                "bound_s": 100.0, "mean_staleness": 0.0 if mode == "sync" else 1.0,
                "max_staleness": 0 if mode == "sync" else 2, "dropped_stale": 0, "steps": 12, "samples": 384,
                "held_out": held, "n_eval": 32, "losses": [0.1], "mismatch_kl": 0.01 if mode == "sync" else 0.03}

    runs = {"sync/0": run(0, "sync", 300, 90, 0.5), "sync/1": run(1, "sync", 200, 90, 0.5),
            "async/0": run(0, "async", 120, 80, 0.5), "async/1": run(1, "async", 100, 80, 0.5)}
    text = report.report({"args": {"out": str(tmp_path)}, "pinned": runs})  # any family or layout name
    assert "### pinned: 2 seed(s) 0, 1" in text
    assert text.count("| 0.1 / 0.1 | 0.01 |") == 1 and text.count("| 0.1 / 0.1 | 0.03 |") == 1  # mismatch KL
    # by seed: 120/300 = 0.40, 100/200 = 0.50 → mean 0.45 ≤ 0.5; wall ÷ bound 1.20, 1.00 → 1.10 ≤ 1.25;
    # trainer idle 1 − 80/120 = 0.33 and 1 − 80/100 = 0.20 → mean 0.27 > 0.20
    assert "wall ÷ sync's (by seed): 0.45 (0.40–0.50), target ≤ 0.5: met" in text
    assert "wall ÷ the run's no-idle bound: 1.10 (1.00–1.20), target ≤ 1.25: met" in text
    assert "trainer idle: 0.27 (0.20–0.33), target ≤ 0.20: NOT met" in text
    assert "against sync's interval [0.38, 0.62]: not below" in text
    assert (tmp_path / "report.md").read_text().strip() == text.strip()


def test_the_gpu_recipes_load_and_the_async_command_uses_the_loops_flags():
    import dataclasses
    import re

    from harnessrl.app.loop.config import LoopConfig
    from harnessrl.app.rollouts.limited_run import RolloutFlags
    from harnessrl.cli_options import flag_names, flag_of
    from harnessrl.trainer.config import load_config

    root = BENCH.parent
    sync, async_ = (load_config(root / "configs" / f, dict(samples="s", model="m", algo="grpo"))
                    for f in ("coding_gpu.yaml", "coding_gpu_async.yaml"))
    # the async recipe is the round recipe's options with the decoupled correction written out
    assert (async_.ratio_to, async_.tis, async_.tis_cap) == ("round", True, 2.0)
    assert dataclasses.replace(async_, ratio_to=sync.ratio_to, tis=sync.tis, tis_cap=sync.tis_cap) == sync
    text = (root / "configs" / "coding_gpu_async.yaml").read_text()
    loop = text[text.index("harnessrl loop"):text.index("--out coding-async")]
    known = {n for cls in (LoopConfig, RolloutFlags) for f in dataclasses.fields(cls) if flag_of(f)
             for n in flag_names(cls, f.name)}
    used = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", loop.split("'")[0] + loop.split("'")[-1]))
    assert {"--async", "--groups-per-step", "--max-staleness", "--eval-every"} <= used and used <= known, used - known


def test_the_real_benchs_corrections_are_train_options():
    """bench/async_real.py's modes each load as the trainer's config, the correction they name on."""
    import yaml

    from harnessrl.trainer.config import TrainConfig

    real = _load("async_real")
    seen = set()
    for mode, text in real.CORRECTIONS.items():
        cfg = TrainConfig(samples="s", model="m", algo="grpo", **yaml.safe_load(text))
        cfg.validate()
        seen.add((cfg.tis, cfg.tis_mode, cfg.tis_level, cfg.tis_band()))
    assert seen == {(True, "truncate", "sequence", (0.0, 2.0)), (True, "mask", "token", (0.0, 2.0)),
                    (True, "icepop", "token", (0.5, 5.0))}
    with pytest.raises(SystemExit):
        real.parse_args(["--modes", "async,async-typo"])
