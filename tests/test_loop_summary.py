"""The loop's round summary: failed rollouts are in no reward mean, but count as not succeeding."""

import pytest

from harnessrl.app.loop.stages import summary as _summary
from harnessrl.harness_examples.chat import RolloutResult

pytestmark = pytest.mark.unit


def _r(outcome, success, error=None):
    return RolloutResult(rollout_id="r", task_id="t", outcome=outcome, metrics={"success": success}, error=error)


def test_a_failed_rollout_is_in_no_reward_mean_but_counts_as_not_succeeding():
    # 3 rollouts: reward 1 (success), reward 0.5 (no success), one failed (crash: no reward).
    reward, success, _ = _summary([_r(1.0, 1.0), _r(0.5, 0.0), _r(0.0, 1.0, error="exit code 3")])
    assert reward == pytest.approx(0.75)  # (1 + 0.5) / 2: the failed one is not a 0
    assert success == pytest.approx(1 / 3)  # 1 of 3: the failed one did not succeed


def test_only_failed_rollouts_succeed_nowhere():
    assert _summary([_r(0.0, 1.0, error="timed out")]) == (0.0, 0.0, 0.0)
