"""Tables printed off a terminal keep whole words (issue 32). Rich assumes 80 columns when stdout
is a pipe or a file and cuts cells with "…" (`succe…`, `weig…` in `make demo`'s log); every
command prints through core's `harnessrl.console.Console`, which off a terminal takes $COLUMNS,
else a width that fits the tables."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no server, database or training: also run on Python 3.12 in CI

REPO = Path(__file__).resolve().parents[1]

# What the loop (`harnessrl loop`, `make demo`) and the demo print, through the Console each
# module prints with, to a pipe.
_PRINT_TABLES = """
from harnessrl.app import demo
from harnessrl.app.loop import sync as loop
from harnessrl.app.loop.state import LoopState
state = LoopState(model="m", initial_eval=0.125)
state.rounds.append(dict(round=0, train_reward=0.5, train_success=0.5, tool_validity=1.0, eval_success=0.25,
                         tokens=123456, samples=48, failed=0, seconds=61.5, version="round-0-a1"))
loop.Console().print(loop.round_table(state))
demo.Console().print(demo.records_table(sys.argv[1]))
"""


def test_tables_printed_to_a_pipe_keep_whole_words(tmp_path):
    from harnessrl.db import open_db

    db = str(tmp_path / "runs.db")
    open_db(db)[0].dispose()
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TERM")}
    out = subprocess.run([sys.executable, "-c", "import sys\n" + _PRINT_TABLES, db], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120, check=True).stdout
    assert "…" not in out, out
    for name in ("round", "reward", "success", "tool-call validity", "eval success", "tokens", "samples",
                 "failed", "time (s)", "weights", "round-0-a1", "prompt prefix/render", "completion tokens",
                 "outcome rewards", "weight versions"):
        assert name in out, f"{name!r} is not whole in:\n{out}"


def test_columns_still_sets_the_width_off_a_terminal():
    env = {**os.environ, "COLUMNS": "50"}
    out = subprocess.run([sys.executable, "-c", "from harnessrl.console import Console; print(Console().width)"],
                         env=env, stdout=subprocess.PIPE, text=True, timeout=60, check=True).stdout
    assert out.strip() == "50"


def _rich_console_imports(root: Path) -> list[str]:
    found = []
    for file in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "rich.console" \
                    and any(a.name == "Console" for a in node.names):
                found.append(f"{file.relative_to(REPO)}:{node.lineno}")
    return found


def test_every_command_prints_through_the_core_console():
    folders = ("harnessrl", "proxy", "compiler", "trainer", "viewer", "harness_examples")
    found = [hit for f in folders for hit in _rich_console_imports(REPO / f)
             if not hit.startswith("harnessrl/console.py:")]
    assert not found, "rich's Console cuts tables at 80 columns off a terminal; use harnessrl.console.Console:\n" \
        + "\n".join(found)
