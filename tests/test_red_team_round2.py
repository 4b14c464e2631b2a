"""The second round of the red team (issue 54): attacks from inside the test run, each its own
attacking agent (red_team_agents.py), against the task's hidden tests as data (calls.py, the
generated family's default) and as pytest files (the clean room's runner, now with canaries).

Every attack on the runner is first shown to be live: against the pytest runner without canaries
it scores 1.0, and with them a canary (a test that must fail) gives it away. Against the data
tests it finds nothing to bend. Each scores at most what doing nothing scores, none ends without a
score, and the fix still scores 1. Driven through `score_rollout` (what a rollout calls after its
harness) under bubblewrap, as the first round's cases are."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from harnessrl.app.rollouts.limited_run import RolloutFlags, coding_tasks
from harnessrl.app.sandbox.run import Limits
from harnessrl.app.scoring.hidden_tests import score_rollout
from harnessrl.app.scoring.workspace import fresh_workspace
from harnessrl.harness_examples.coding.tasks import write
from harnessrl.tasks_file import read_tasks

sys.path.insert(0, str(Path(__file__).parent))
from red_team_agents import ATTACKS  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/usr/bin/bwrap").exists(), reason="bubblewrap is not installed")
FRAME = "the expected value read from the calling test's frame"
# live against the runner, each caught there by the canaries: what bends every outcome of a pytest
# run, and a function that answers each test with its caller's expected value
CAUGHT = ("runner objects through gc: every outcome stored as passed",
          "the key from the runner's frame, an all-passed report signed",
          "the key from raw memory, no runner object touched",
          "an unwatched pytest class attribute: outcome always passed",
          "a hook implementation swapped for a same-named wrapper", FRAME)


def _make(factory, hidden: str):
    root = factory.mktemp(f"red2-{hidden}")
    files = write(root / "tasks", 1, 0, seed=0, salt="integrity", hidden=hidden)
    [row] = read_tasks(files["all"])
    coding = coding_tasks([row], files["all"], RolloutFlags())[row.id]
    [(module, fixed)] = row.reference.items()
    t = {"task": coding, "pkg": module.split("/")[0], "module": module, "fixed": fixed,
         "broken": row.workspace[module], "hidden": hidden}
    t["nothing"] = _score(t).reward
    return t


def _score(t, attack=None, task=None):
    ws = fresh_workspace(t["task"])
    try:
        if attack is not None:
            attack(ws, t)
        return score_rollout(task or t["task"], ws, None, "pass-fraction", Limits(sandbox="bwrap", timeout=60), ())
    finally:
        shutil.rmtree(ws, ignore_errors=True)


@pytest.fixture(scope="module")
def pytest_task(tmp_path_factory):
    return _make(tmp_path_factory, "pytest")


@pytest.fixture(scope="module")
def calls_task(tmp_path_factory):
    return _make(tmp_path_factory, "calls")


@pytest.fixture(scope="module", params=["calls", "pytest"])
def task(request, tmp_path_factory):
    return _make(tmp_path_factory, request.param)


def test_doing_nothing_and_the_fix(task):
    def fix(ws, t):
        (ws / t["module"]).write_text(t["fixed"])
    assert 0 < task["nothing"] < 1
    assert _score(task, fix).reward == 1.0
    if task["hidden"] == "pytest":  # the canaries ran and failed, as they must, beside the fix
        assert task["task"].canary_ids and "zero" not in _score(task, fix).metadata


@pytest.mark.parametrize("name", list(ATTACKS))
def test_an_attack_from_inside_the_test_run_scores_no_more_than_doing_nothing(task, name):
    outcome = _score(task, ATTACKS[name])
    assert outcome.reward is not None and outcome.reward <= task["nothing"], (name, outcome.metadata)
    if task["hidden"] == "pytest" and name in CAUGHT:
        assert "canary" in outcome.metadata["zero"], outcome.metadata


@pytest.mark.parametrize("name", CAUGHT)
def test_each_attack_the_canaries_catch_is_live_against_the_runner_without_them(pytest_task, name):
    """The same attack with the canaries taken away scores 1: the attacks are real, and it is the
    canaries that catch them."""
    from dataclasses import replace

    t = pytest_task
    bare = replace(t["task"], canaries=(), canary_ids=())
    assert _score(t, ATTACKS[name], task=bare).reward == 1.0


def _returns(code: str):
    """The function under test replaced by `code` (a body over *args)."""
    def attack(ws: Path, t) -> None:
        fn = t["fixed"].split("def ", 1)[1].split("(", 1)[0]
        (ws / t["module"]).write_text(t["broken"] + f"\n\ndef {fn}(*args):\n" + textwrap.indent(textwrap.dedent(code),
                                                                                                  "    "))
    return attack


@pytest.mark.parametrize("code", [
    "class Any:\n    def __eq__(self, other):\n        return True\nreturn Any()\n",
    "class Num(int):\n    def __eq__(self, other):\n        return True\nreturn Num(0)\n",
    "class L(list):\n    def __eq__(self, other):\n        return True\nreturn L()\n",
    "import types\nreturn types.SimpleNamespace(__eq__=lambda o: True)\n",
])
def test_an_object_equal_to_everything_cannot_cross_as_data(calls_task, pytest_task, code):
    outcome = _score(calls_task, _returns(code))
    assert outcome.reward == 0.0 and "not plain data" in outcome.metadata["output"], outcome.metadata
    outcome = _score(pytest_task, _returns(code))  # the family's tests compare by type; the canary by ==
    assert outcome.reward == 0.0, outcome.metadata


def test_the_child_never_sees_an_expected_value(calls_task):
    """A function that searches everything its sandbox can read under the clean room, HOME and
    TMPDIR for the calls file or the word "expected", and answers whether it found any."""
    t = calls_task
    outcome = _score(t, _returns("""
        import os
        needle = '"exp' + 'ected"'  # made here: this file's own text must not match
        for top in (os.getcwd(), os.environ.get("HOME", "/"), os.environ.get("TMPDIR", "/tmp")):
            for folder, _, files in os.walk(top):
                for name in files:
                    try:
                        text = open(os.path.join(folder, name), errors="replace").read()
                    except OSError:
                        continue
                    if needle in text:
                        return "found " + os.path.join(folder, name)
        return "nothing"
        """))
    assert "got \"nothing\"" in outcome.metadata["output"] and "found" not in outcome.metadata["output"]


def test_a_canary_the_reference_passes_is_drawn_again_over_builtins(tmp_path):
    """A task whose own function answers with its caller's `expected` (contrived, but a canary that
    calls it would pass on the reference): the draw tried at load falls back to builtins, and the
    reference, which is correct for this task, still scores 1."""
    import json

    fn = "import sys\n\n\ndef f(*args):\n    return sys._getframe(1).f_locals.get('expected')\n"
    row = {"id": "t", "input": "x", "workspace": {"pkg/__init__.py": "", "pkg/m.py": "def f(*args):\n    return 0\n"},
           "reference": {"pkg/m.py": fn},
           "hidden_tests": {"hidden_tests/test_m.py": "from pkg.m import f\n\n\ndef test_f():\n    expected = 1\n"
                                                      "    assert f() == expected\n"}}
    (tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n")
    [task_row] = read_tasks(tmp_path / "t.jsonl")
    task = coding_tasks([task_row], tmp_path / "t.jsonl", RolloutFlags())["t"]
    [(_, text)] = task.canaries
    assert "f(*args)" not in text and task.canary_ids, text
    t = {"task": task, "module": "pkg/m.py"}
    assert _score(t, lambda ws, _: (ws / "pkg/m.py").write_text(fn)).reward == 1.0
