"""The pytest markers mark what they say (issue 32): `postgres` and `gpu` were registered and
marked nothing, so `-m postgres` selected no test and `-m "not postgres"` ran them all."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # collects only: no server, database or training

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
# the PostgreSQL tests come in every form: the pg_url fixture as an argument, the db_target
# fixture's "postgres" parameter, a test file's own fixture parametrized over both databases;
# and a file without any
PG_FILES = ["test_proxy_rollout_state.py", "test_db.py", "test_proxy_fuzz.py"]
NO_PG = "test_compiler_trees.py"


def test_every_registered_marker_marks_some_test():
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    source = "\n".join(p.read_text() for p in TESTS.glob("*.py"))
    unused = [m.split(":")[0] for m in markers if not re.search(rf"mark\.{m.split(':')[0]}\b", source)]
    assert not unused, f"registered but marking nothing: {unused}"


def _collect(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args,
                           *PG_FILES, NO_PG], cwd=TESTS, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: nothing selected
    return [line for line in done.stdout.splitlines() if "::" in line]


def _uses_postgresql(test_id: str) -> bool:
    path, _, name = test_id.partition("::")
    func, _, params = name.partition("[")
    if "postgres" in params.rstrip("]").split("-"):
        return True
    tree = ast.parse((REPO / path).read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == func)
    return "pg_url" in [a.arg for a in fn.args.args]


def test_the_postgres_marker_selects_exactly_the_postgresql_tests():
    selected, rest = _collect("-m", "postgres"), _collect("-m", "not postgres")
    assert any(Path(i.split("::")[0]).name == NO_PG for i in rest)
    assert {Path(i.split("::")[0]).name for i in selected} == set(PG_FILES)  # each form is marked
    assert all(_uses_postgresql(i) for i in selected), [i for i in selected if not _uses_postgresql(i)]
    assert not any(_uses_postgresql(i) for i in rest), [i for i in rest if _uses_postgresql(i)]
