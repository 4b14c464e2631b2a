"""The coding task family's generator: deterministic, held-out apart from training, every task
failing its hidden tests as given and passing them with its reference (real pytest), and the
`harnessrl tasks coding` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.harness_examples.coding.tasks import generate, write
from harnessrl.harness_examples.coding.templates import TEMPLATES
from harnessrl.tasks_file import read_tasks


def _lay(tree: dict, root: Path) -> None:
    for name, text in tree.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _pytest(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "hidden_tests", "tests"],
                          cwd=root, capture_output=True, text=True, timeout=120)


def test_generation_is_deterministic_varied_and_held_out_apart():
    train, held = generate(24, 24, seed=7, salt="s")
    assert (train, held) == generate(24, 24, seed=7, salt="s")
    assert generate(3, 24, seed=7, salt="s")[1] == held  # the held-out set does not depend on --n-train
    assert train != generate(24, 24, seed=8, salt="s")[0]
    assert {r["family"] for r in train} == {t.family for t in TEMPLATES}
    assert {r["kind"] for r in train} == {"bug", "missing"}

    def code(r):  # what a held-out task asks for: its family, kind and the module it ships
        return r["family"], r["kind"], r["reference"]
    assert not {str(code(r)) for r in train} & {str(code(r)) for r in held}


def test_the_hidden_cases_as_data_are_the_pytest_files_cases():
    """`hidden="calls"` (the default) and `"pytest"` hold the same cases; only their form differs."""
    calls, _ = generate(3, 0, seed=4, salt="s")
    files, _ = generate(3, 0, seed=4, salt="s", hidden="pytest")
    for a, b in zip(calls, files):
        assert {k: v for k, v in a.items() if k != "hidden_tests"} == {k: v for k, v in b.items() if k != "hidden_tests"}
        [text] = b["hidden_tests"].values()
        cases = json.loads(a["hidden_tests"]["hidden_tests/calls.json"])["cases"]
        assert [c["id"] for c in cases] == [f"case{i}" for i in range(len(cases))] and len(cases) == text.count("\n    ((")
        for c in cases:
            assert f"({tuple(c['args'])!r}, {c['expected']!r})" in text


def test_without_its_salt_the_seed_does_not_replay_the_tasks():
    """What a sandboxed agent can do: run the installed generator with the seed (0, the default)."""
    made = generate(4, 2, seed=0, salt="the operator's secret")
    made_hidden = {json.dumps(r["hidden_tests"]) for r in made[0] + made[1]}
    for replay in (generate(4, 2, seed=0), generate(4, 2, seed=0, salt=""), generate(4, 2, seed=0, salt="other")):
        # no replay is the made task set, and no hidden test file of a replayed task is one of the
        # made tasks' (what the reward rests on). A reference module is not checked: it is the task's
        # answer, and the templates' small modules come out alike by chance (1 guess in 3 made one
        # of them again; asserting none flaked in CI)
        assert replay != made
        assert not {json.dumps(r["hidden_tests"]) for r in replay[0] + replay[1]} & made_hidden
    assert generate(4, 2, seed=0) != generate(4, 2, seed=0)  # no salt: a fresh one each call


def test_an_object_equal_to_everything_fails_the_generated_tests(tmp_path):
    """The AlwaysEqual hack: a return value whose __eq__ says True to any expected value."""
    [row], _ = generate(1, 0, seed=2, salt="", hidden="pytest")
    _lay(row["workspace"], tmp_path)
    _lay(row["hidden_tests"], tmp_path)
    [(path, text)] = row["reference"].items()
    fn = text.split("def ", 1)[1].split("(", 1)[0]
    (tmp_path / path).write_text(f"class Any:\n    def __eq__(self, other):\n        return True\n\n\n"
                                 f"def {fn}(*args):\n    return Any()\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "hidden_tests"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and " passed" not in done.stdout.splitlines()[-1], done.stdout[-800:]


@pytest.mark.slow  # 24 pytest runs: ~40 s on an idle core
def test_every_task_fails_as_given_and_passes_with_its_reference(tmp_path):
    train, _ = generate(len(TEMPLATES), 0, seed=1, salt="", hidden="pytest")  # every template once, the kinds alternating
    for row in train:
        root = tmp_path / row["id"]
        _lay(row["workspace"], root)
        _lay(row["hidden_tests"], root)
        assert _pytest(root).returncode == 1, row["id"]
        _lay(row["reference"], root)
        done = _pytest(root)
        assert done.returncode == 0, (row["id"], done.stdout[-800:])


def test_the_tasks_coding_command_writes_a_tasks_file(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harnessrl", "tasks", "coding", "--out", str(tmp_path),
                           "--n-train", "6", "--n-eval", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--eval-fraction 0.25" in done.stdout
    rows = read_tasks(tmp_path / "coding.jsonl")
    assert [r.id for r in rows][-2:] == ["coding-eval-0000", "coding-eval-0001"]
    assert all(isinstance(r.workspace, dict) and isinstance(r.hidden_tests, dict) for r in rows)
    salted = subprocess.run([sys.executable, "-m", "harnessrl", "tasks", "coding", "--out", str(tmp_path / "a"),
                             "--n-train", "2", "--n-eval", "1", "--salt", "q7-salt"],
                            capture_output=True, text=True, timeout=120)
    assert salted.returncode == 0, salted.stderr
    text = (tmp_path / "a" / "coding.jsonl").read_text()
    assert text == write(tmp_path / "b", 2, 1, 0, "q7-salt")["all"].read_text()  # the salt given: the same tasks
    assert text != write(tmp_path / "c", 2, 1, 0)["all"].read_text()  # none: a fresh salt
    assert not any("q7-salt" in p.read_text() for p in (tmp_path / "a").iterdir())  # kept nowhere
    bad = subprocess.run([sys.executable, "-m", "harnessrl", "tasks", "coding", "--out", str(tmp_path),
                          "--n-train", "0", "--n-eval", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --n-train")
