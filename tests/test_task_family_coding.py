"""The coding task family's generator: deterministic, held-out apart from training, every task
failing its hidden tests as given and passing them with its reference (real pytest), and the
`harnessrl tasks coding` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.harness_examples.coding.tasks import generate
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


def test_without_its_salt_the_seed_does_not_replay_the_tasks():
    """What a sandboxed agent can do: run the installed generator with the seed (0, the default)."""
    made = generate(4, 2, seed=0, salt="the operator's secret")
    for replay in (generate(4, 2, seed=0), generate(4, 2, seed=0, salt=""), generate(4, 2, seed=0, salt="other")):
        # no reference, and no hidden test file, of any replayed task is one of the made tasks'
        references = {json.dumps(r["reference"]) for r in replay[0] + replay[1]}
        hidden = {json.dumps(r["hidden_tests"]) for r in replay[0] + replay[1]}
        assert not references & {json.dumps(r["reference"]) for r in made[0] + made[1]}
        assert not hidden & {json.dumps(r["hidden_tests"]) for r in made[0] + made[1]}
    assert generate(4, 2, seed=0) != generate(4, 2, seed=0)  # no salt: a fresh one each call


@pytest.mark.slow  # 24 pytest runs: ~40 s on an idle core
def test_every_task_fails_as_given_and_passes_with_its_reference(tmp_path):
    train, _ = generate(len(TEMPLATES), 0, seed=1, salt="")  # every template once, the kinds alternating
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
                           "--n-train", "6", "--n-eval", "2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--eval-fraction 0.25" in done.stdout
    rows = read_tasks(tmp_path / "coding.jsonl")
    assert [r.id for r in rows][-2:] == ["coding-eval-0000", "coding-eval-0001"]
    assert all(isinstance(r.workspace, dict) and isinstance(r.hidden_tests, dict) for r in rows)
    again = tmp_path / "again"
    salted = [subprocess.run([sys.executable, "-m", "harnessrl", "tasks", "coding", "--out", str(again / name),
                              "--n-train", "2", "--n-eval", "1", *salt], capture_output=True, text=True, timeout=60)
              for name, salt in (("a", ["--salt", "q7-salt"]), ("b", ["--salt", "q7-salt"]), ("c", []))]
    assert [d.returncode for d in salted] == [0, 0, 0]
    text = {name: (again / name / "coding.jsonl").read_text() for name in "abc"}
    assert text["a"] == text["b"] != text["c"]  # the salt given: the same tasks; none: a fresh salt
    assert not any("q7-salt" in p.read_text() for p in again.rglob("*") if p.is_file())  # kept nowhere
    bad = subprocess.run([sys.executable, "-m", "harnessrl", "tasks", "coding", "--out", str(tmp_path),
                          "--n-train", "0", "--n-eval", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --n-train")
