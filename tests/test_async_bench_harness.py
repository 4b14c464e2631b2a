"""The async benchmark's slow toolbox (harness_examples/toolbox/slow.py): per-task delays that are
deterministic in the task id and long-tailed across tasks, carried through the tasks file, and
spent once, inside the rollout's first tool call."""

import math
import statistics

import pytest

from harnessrl.harness_examples.toolbox import slow


@pytest.mark.unit
def test_delays_are_deterministic_per_task_and_long_tailed():
    train, held = slow.generate(0, median_s=2.0)
    again, _ = slow.generate(5, median_s=2.0)  # another seed: another split, the same delay per task id
    by_id = {t.id: t.delay_s for t in train + held}
    assert all(by_id[t.id] == t.delay_s for t in again)
    assert slow.delay_for(train[0].id, 2.0) == train[0].delay_s
    delays = sorted(by_id.values())
    assert len(delays) == 128 and min(delays) > 0
    # lognormal(ln 2, 0.7): log-delays have mean ln 2 and sd 0.7, so over 128 tasks the sample's are
    # within ±0.2 of those (4 standard errors of the mean, ~5 of the sd's)
    logs = [math.log(d) for d in delays]
    assert abs(statistics.mean(logs) - math.log(2.0)) < 0.2 and abs(statistics.stdev(logs) - 0.7) < 0.2
    # long tail: the mean above the median (1.28× in the limit), p95/p5 near 10
    assert statistics.mean(delays) > statistics.median(delays) * 1.1
    p5, p95 = delays[round(0.05 * 127)], delays[round(0.95 * 127)]
    assert 5 < p95 / p5 < 20
    # the scale is a factor: the same draw times the median
    assert slow.delay_for("t", 4.0) == pytest.approx(2 * slow.delay_for("t", 2.0))


@pytest.mark.unit
def test_tasks_file_carries_the_delay(tmp_path):
    train, _ = slow.generate(1, median_s=0.5)
    path = slow.write(train[:3], tmp_path / "tasks.jsonl")
    assert slow.read(path) == train[:3]
    assert '"delay_s": ' in path.read_text().splitlines()[0]


@pytest.mark.unit
def test_the_delay_is_spent_once_in_the_first_lookup(monkeypatch):
    slept = []
    monkeypatch.setattr(slow.time, "sleep", slept.append)
    table = slow.SlowTable({("moon", "color"): "red"}, 0.3)
    assert table[("moon", "color")] == "red" and len(table) == 1 and not slept  # not a tool's lookup
    assert ("moon", "size") not in table  # the first tool call, a wrong one, pays it
    assert ("moon", "color") in table and ("moon", "color") in table
    assert slept == [0.3]


@pytest.mark.unit
def test_the_registry_reads_the_delays_from_the_tasks_file(tmp_path):
    from harnessrl.app.rollouts.harnesses import TaskSource, load_harness

    train, held = slow.generate(2, median_s=0.25)
    path = slow.write(train[:6] + held[:2], tmp_path / "tasks.jsonl")
    h = load_harness("toolbox_slow", TaskSource(path, None, tmp_path, None, 0.25, 2))
    assert (h.train, h.eval) == (train[:6], held[:2])  # the file's tail held out, each task with its delay
    assert [t.delay_s for t in h.train] == [slow.delay_for(t.id, 0.25) for t in train[:6]]
