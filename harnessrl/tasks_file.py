"""The tasks file: one JSON object per line with `id`, `input` (text or chat messages), optional
`reference` (alias `answer`), optional `reference_calls` ([{name, arguments}]) and optional
`expert_trace` (the expert's chat messages). A coding task (`harnessrl tasks coding`) also has a
`workspace` — the repository the harness works in — and `hidden_tests`, laid over it only for
the reward; each is a folder (relative to the tasks file) or an inline {relative path: text}
object. Optional `reward_cmd`: the shell line that scores it (default: pytest on the hidden
tests; app/scoring/hidden_tests.py); optional `solution`: the workspace paths the agent may change, the only
ones scored (default: the workspace's top-level packages; app/scoring/clean_room.py). Read by
`harnessrl tasks import` (compiler), `sft` and PACT (trainer) and user harnesses in `loop` (app):
one parser, one set of rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from harnessrl.errors import UserError


@dataclass
class TaskRow:
    id: str
    input: Any
    reference: Any
    reference_calls: list[Any] | None
    expert_trace: list[dict[str, Any]] | None
    workspace: Path | dict[str, str] | None = None  # a coding task's repository: a folder or inline files
    hidden_tests: Path | dict[str, str] | None = None  # laid over the workspace for the reward only
    reward_cmd: str | None = None
    solution: list[str] | None = None  # the solution surface: workspace paths the reward takes from the agent


def _check_calls(calls: Any, where: str) -> list[Any]:
    if not isinstance(calls, list) or not all(
        isinstance(c, dict) and isinstance(c.get("function", c).get("name"), str) for c in calls
    ):
        raise UserError(f"{where}: reference_calls must be a list of {{name, arguments}} objects")
    return calls


def parse_line(line: str, where: str, base: Path | None = None) -> TaskRow:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise UserError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected a JSON object")
    if not isinstance(obj.get("id"), (str, int)) or obj.get("id") == "":
        raise UserError(f"{where}: missing task id")
    if "input" not in obj:
        raise UserError(f"{where}: missing input")
    calls = obj.get("reference_calls")
    trace = obj.get("expert_trace")
    if trace is not None and not (isinstance(trace, list) and all(isinstance(m, dict) and "role" in m for m in trace)):
        raise UserError(f"{where}: expert_trace must be a list of chat messages with a role")
    reward_cmd = obj.get("reward_cmd")
    if reward_cmd is not None and not (isinstance(reward_cmd, str) and reward_cmd.strip()):
        raise UserError(f"{where}: reward_cmd must be a shell command line")
    solution = obj.get("solution")
    if solution is not None and not (isinstance(solution, list) and solution and
                                     all(isinstance(p, str) and p for p in solution)):
        raise UserError(f"{where}: solution must be a list of workspace paths, e.g. [\"mypkg\"]")
    return TaskRow(
        id=str(obj["id"]),
        input=obj["input"],
        reference=obj.get("reference", obj.get("answer")),
        reference_calls=_check_calls(calls, where) if calls is not None else None,
        expert_trace=trace,
        workspace=_tree(obj.get("workspace"), f"{where}: workspace", base),
        hidden_tests=_tree(obj.get("hidden_tests"), f"{where}: hidden_tests", base),
        reward_cmd=reward_cmd,
        solution=solution,
    )


def _tree(value: Any, where: str, base: Path | None) -> Path | dict[str, str] | None:
    """A folder (relative to the tasks file's folder `base`) or {relative path: text}."""
    if value is None:
        return None
    if isinstance(value, str) and value:
        return (base or Path(".")) / value
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        for name in value:
            parts = PurePosixPath(name)
            if not name or parts.is_absolute() or ".." in parts.parts:
                raise UserError(f"{where}: {name!r} is not a relative path inside the workspace")
        return value
    raise UserError(f"{where}: a folder (relative to the tasks file) or an object of relative path → file text")


def read_tasks(path: Path) -> list[TaskRow]:
    if not path.is_file():
        raise UserError(f"tasks file not found: {path}")
    rows, seen = [], set()
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = parse_line(line, f"{path}:{n}", path.resolve().parent)
        if row.id in seen:
            raise UserError(f"{path}:{n}: duplicate task id {row.id!r}")
        seen.add(row.id)
        rows.append(row)
    return rows
