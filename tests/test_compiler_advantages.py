"""Advantage estimators (docs/methods.md §5) against numbers worked out by hand."""

import math
from collections import Counter

import pytest

from harnessrl.compiler import advantages as adv
from harnessrl.errors import UserError

pytestmark = pytest.mark.unit  # no server, database or training: also run on Python 3.12 in CI

EPS = 1e-6
RAW = adv.AdvantageConfig(singleton="raw")  # a group of one keeps its raw value (mean 0, std 1)
R2 = 1 / math.sqrt(2)  # any two distinct values normalise to ±1/√2 with the sample std


def test_normalize_sample_population_and_group_of_one():
    # [1,0,0,1]: mean 0.5; sample std = sqrt(4·0.25/3) = 0.57735 → ±0.5/0.57735 = ±0.866025
    assert adv.normalize([1, 0, 0, 1]).tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5)
    # population std 0.5 → ±0.5/(0.5+1e-6)
    pop = adv.AdvantageConfig(std="population")
    assert adv.normalize([1, 0, 0, 1], pop).tolist() == pytest.approx([0.999998, -0.999998, -0.999998, 0.999998])
    # a group of one has no baseline: 0 by default, counted; raw: mean 0, std 1 → 0.7/(1+1e-6)
    counts = Counter()
    assert adv.normalize([0.7], counts=counts).tolist() == [0.0] and counts == {"singleton_groups": 1}
    assert adv.normalize([0.7], RAW).tolist() == [0.7 / (1 + EPS)]
    # equal rewards: std 0 → 0/(0+eps) = 0
    assert adv.normalize([0.3, 0.3]).tolist() == [0.0, 0.0]


def test_grpo():
    rewards = {"e1": 1, "e2": 0, "e3": 0, "e4": 1, "e5": 0.7}
    groups = {"e1": "g1", "e2": "g1", "e3": "g1", "e4": "g1", "e5": "g2"}
    counts = Counter()
    out = adv.grpo(rewards, groups, counts=counts)
    assert out["e1"] == pytest.approx(0.866025, abs=1e-5) and out["e2"] == pytest.approx(-0.866025, abs=1e-5)
    assert out["e5"] == 0.0 and counts["singleton_groups"] == 1  # g2 has one rollout: no baseline
    assert adv.grpo(rewards, groups, RAW)["e5"] == pytest.approx(0.7 / (1 + EPS), abs=1e-12)


def test_harness_outcome_plus_process_by_agent_and_index():
    outcome = {"e1": 1.0, "e2": 0.0}
    groups = {"e1": "g", "e2": "g"}
    units = {
        "e1p0": ("e1", "planner", 0, 1.0), "e1p1": ("e1", "planner", 1, 0.5), "e1w0": ("e1", "worker", 0, 1.0),
        "e2p0": ("e2", "planner", 0, 0.0), "e2p1": ("e2", "planner", 1, None),
    }
    counts = Counter()
    zero = adv.harness(outcome, groups, units, counts=counts)
    # buckets of one ((planner,1), (worker,0)) get Ã = 0 by default and are counted
    assert zero["e1p1"] == pytest.approx(R2, abs=1e-5) and zero["e1w0"] == pytest.approx(R2, abs=1e-5)
    assert counts == {"singleton_buckets": 2}
    a = adv.harness(outcome, groups, units, RAW)
    # Â = ±1/√2 = ±0.707107. Ã: (planner,0) over [1, 0] → ±0.707107; (planner,1) only e1's 0.5 →
    # raw: 0.5/(1+eps); (worker,0) only 1.0 → 1/(1+eps); e2p1 has no process reward → 0
    assert a["e1p0"] == pytest.approx(R2 + 0.1 * R2, abs=1e-5)  # 0.777817
    assert a["e1p1"] == pytest.approx(R2 + 0.05, abs=1e-5)  # 0.757107
    assert a["e1w0"] == pytest.approx(R2 + 0.1, abs=1e-5)  # 0.807107
    assert a["e2p0"] == pytest.approx(-R2 - 0.1 * R2, abs=1e-5)  # -0.777817
    assert a["e2p1"] == pytest.approx(-R2, abs=1e-5)
    # option: normalise across all the group's units: [1, 0.5, 1, 0] mean 0.625, deviations
    # .375 -.125 .375 -.625, sample var = .6875/3 = .229167, std .478714
    a_all = adv.harness(outcome, groups, units, adv.AdvantageConfig(proc_norm="all"))
    assert a_all["e1p1"] == pytest.approx(R2 + 0.1 * (-0.125 / 0.478714), abs=1e-5)
    assert a_all["e2p0"] == pytest.approx(-R2 + 0.1 * (-0.625 / 0.478714), abs=1e-5)


def test_matpo_reward_and_planner_group_normalisation():
    # e1: 0.9·1 + 0.1·(0.5·1 + 0.5·mean(1, 0.5)) = 0.9 + 0.1·0.875 = 0.9875
    assert adv.matpo_reward(1.0, 1.0, [1.0, 0.5]) == pytest.approx(0.9875)
    # e2: no worker dispatched → fmt_w = 0: 0.1·(0.5·0.5) = 0.025
    assert adv.matpo_reward(0.0, 0.5, []) == pytest.approx(0.025)
    acc, fmt_p = {"e1": 1.0, "e2": 0.0, "e3": 1.0}, {"e1": 1.0, "e2": 0.5, "e3": 0.0}
    fmt_w, groups = {"e1": [1.0, 0.5], "e3": [0.0]}, {"e1": "g", "e2": "g", "e3": "g"}
    # the default, the paper's group: the G planner rollouts ("among G full rollouts")
    a = adv.matpo(acc, fmt_p, fmt_w, groups)
    assert adv.AdvantageConfig().matpo_norm == "planner"
    # R = [0.9875, 0.025, 0.9]: mean 0.6375, deviations .35 -.6125 .2625,
    # sample var (.1225 + .37515625 + .06890625)/2 = .28328125, std .532242
    assert a["e1"] == pytest.approx(0.35 / 0.532242, abs=1e-5)  # 0.657596
    assert a["e2"] == pytest.approx(-0.6125 / 0.532242, abs=1e-5)  # -1.150792
    assert a["e3"] == pytest.approx(0.2625 / 0.532242, abs=1e-5)  # 0.493197
    # option matpo_norm="turns" (a departure): G×(T+1), e1 with 2 workers counts 3 times, e2 (none)
    # once, e3 twice: [.9875 ×3, .025, .9 ×2]: mean 4.7875/6 = .7979167, deviations .1895833
    # −.7729167 .1020833, squares ×3, ×1, ×2: .1078255 + .5974002 + .0208420 = .7260677, sample var
    # /5 = .1452135, std .3810690
    a = adv.matpo(acc, fmt_p, fmt_w, groups, adv.AdvantageConfig(matpo_norm="turns"))
    assert a["e1"] == pytest.approx(0.1895833 / 0.3810690, abs=1e-5)  # 0.497500
    assert a["e2"] == pytest.approx(-0.7729167 / 0.3810690, abs=1e-5)  # -2.028283
    assert a["e3"] == pytest.approx(0.1020833 / 0.3810690, abs=1e-5)  # 0.267887


def test_matpo_turns_group_weighs_a_rollout_by_its_worker_count():
    # R = (1, 0); e1 dispatched 2 workers, e2 none: the group is [1, 1, 1, 0], mean .75,
    # sample std √((3·.0625 + .5625)/3) = .5: A = (1 − .75)/.5 = +0.5 and (0 − .75)/.5 = −1.5
    # (over the 2 planner rollouts alone it would be ±0.7071)
    cfg = adv.AdvantageConfig(matpo_acc=1.0, matpo_fmt=0.0, matpo_norm="turns")
    a = adv.matpo({"e1": 1.0, "e2": 0.0}, {"e1": 1.0, "e2": 1.0}, {"e1": [1.0, 1.0]}, {"e1": "g", "e2": "g"}, cfg)
    assert (a["e1"], a["e2"]) == (pytest.approx(0.5, abs=1e-5), pytest.approx(-1.5, abs=1e-5))
    planner = adv.matpo({"e1": 1.0, "e2": 0.0}, {"e1": 1.0, "e2": 1.0}, {"e1": [1.0, 1.0]}, {"e1": "g", "e2": "g"},
                        adv.AdvantageConfig(matpo_acc=1.0, matpo_fmt=0.0))
    assert (planner["e1"], planner["e2"]) == (pytest.approx(0.70711, abs=1e-5), pytest.approx(-0.70711, abs=1e-5))
    # equal worker counts: the mean is the planners' and only the std's degrees of freedom differ,
    # population std the same: R = (1, 0), one worker each → [1, 1, 0, 0], std .5 → ±1 either way
    pop = adv.AdvantageConfig(matpo_acc=1.0, matpo_fmt=0.0, std="population")
    for norm in ("turns", "planner"):
        a = adv.matpo({"e1": 1.0, "e2": 0.0}, {"e1": 1.0, "e2": 1.0}, {"e1": [1.0], "e2": [1.0]},
                      {"e1": "g", "e2": "g"}, adv.AdvantageConfig(**{**pop.as_dict(), "matpo_norm": norm}))
        assert (a["e1"], a["e2"]) == (pytest.approx(1.0, abs=1e-5), pytest.approx(-1.0, abs=1e-5))
    with pytest.raises(UserError, match="matpo_norm='tokens': use turns or planner"):
        adv.AdvantageConfig(matpo_norm="tokens")


def test_matchtir_global_plus_discounted_local():
    assert adv.discounted_returns([0.0, 0.25, 0.5], 0.9) == pytest.approx([0.63, 0.7, 0.5])
    turns = {"k1": [0.5, 1.0], "k2": [0.0, 0.25, 0.5]}
    groups = {"k1": "g", "k2": "g"}
    # A^g: R = [1.5, 0.75] → k1 +1/√2, k2 −1/√2
    # G: k1 [1.4, 1.0]; k2 [0.63, 0.7, 0.5]. A^l at t0: [1.4, .63] → ±1/√2; t1: [1.0, 0.7] → ±1/√2;
    # t2: only k2 → 0 by default (a bucket of one), raw 0.5/(1+eps)
    counts = Counter()
    zero = adv.matchtir(turns, groups, counts=counts)
    assert zero["k2"][2] == pytest.approx(-R2, abs=1e-5) and counts == {"singleton_buckets": 1}
    a = adv.matchtir(turns, groups, RAW)
    assert a["k1"] == pytest.approx([2 * R2, 2 * R2], abs=1e-5)
    assert a["k2"] == pytest.approx([-2 * R2, -2 * R2, -R2 + 0.5], abs=1e-5)  # last: -0.207107
    half = adv.matchtir(turns, groups, adv.AdvantageConfig(alpha=0.5, singleton="raw"))
    assert half["k2"][2] == pytest.approx(0.5 * (-R2 + 0.5), abs=1e-5)  # -0.103553
    # three rollouts, one turn each: G = r; R = r: A^g = A^l = normalise([1, 0, 0.5]) = [1, -1, 0]
    # (mean 0.5, sample std 0.5); A = 2·[1, -1, 0] with eps
    three = adv.matchtir({"a": [1.0], "b": [0.0], "c": [0.5]}, {"a": "g", "b": "g", "c": "g"})
    assert [three[k][0] for k in "abc"] == pytest.approx([2 * 0.5 / (0.5 + EPS), -2 * 0.5 / (0.5 + EPS), 0.0])
