"""Scripted edits for coding tasks (harness_examples/coding): shell lines a scripted model runs
through a harness's own shell tool (tests/scripted_agent.py `commands`). Short, plain-text lines:
a harness that sends no max_tokens gets the server's default, and a long reply would be cut off."""

from __future__ import annotations

import re


def needle(row: dict) -> str:
    """What names this task in its statement: "`fn` in `pkg/mod.py`"."""
    found = re.search(r"`\w+` in `[\w/]+\.py`", row["input"])
    assert found, row["input"]
    return found.group(0)


def fix_command(row: dict) -> str:
    """Replace the lines the task's module differs in from its reference (the fix) by the
    reference's: python3 edits the file in place."""
    (path, fixed), = row["reference"].items()
    old_lines, new_lines = row["workspace"][path].splitlines(keepends=True), fixed.splitlines(keepends=True)
    head = 0
    while head < min(len(old_lines), len(new_lines)) and old_lines[head] == new_lines[head]:
        head += 1
    tail = 0
    while tail < min(len(old_lines), len(new_lines)) - head and old_lines[-1 - tail] == new_lines[-1 - tail]:
        tail += 1
    old = "".join(old_lines[head:len(old_lines) - tail])
    new = "".join(new_lines[head:len(new_lines) - tail])
    assert old and row["workspace"][path].count(old) == 1, (path, old)
    # a quoted here-document: the code needs no shell quoting (which would double its length)
    return f"python3 - <<'PY'\nimport pathlib\np = pathlib.Path({path!r})\np.write_text(p.read_text().replace({old!r}, {new!r}))\nPY"


def wrong_command(row: dict) -> str:
    """An edit that changes the module but fixes nothing."""
    (path, _), = row["reference"].items()
    return f"printf '\\n# looked at it\\n' >> {path}"
