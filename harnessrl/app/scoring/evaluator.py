"""The untrusted child of a data-test run (calls.py), run by path in a fresh sandbox:

    python -I -B evaluator.py IO_DIR WORKSPACE

Standard library only, never imported by harnessrl. It reads IO_DIR/calls.json — each call's
target ("package.module:function") and its arguments, never an expected value: the child cannot
give away what it does not hold — and opens IO_DIR/answers.jsonl before any of the workspace's
code runs. Then, for each call in order, it imports the target from the workspace and writes one
JSON line: {"ok": RESULT} with RESULT as plain data, or {"error": "..."} when the call raised or its
result is not plain data. Plain data is JSON of exact basic types: None, bool, int, float, str,
lists (a tuple is written as a list) and dicts with str keys; an object whose `__eq__` always says
True, a proxy or a subclass of a basic type cannot cross, so the parent compares values, never
the agent's objects. Each line is written as it is made, so a hang loses only the calls after it.

The code under test runs in this process and may write anything to the answers file: that is the
agent's answer either way. What it cannot do is see the expected values or the comparison, which
only the parent (the host, outside this sandbox's process tree) holds.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

MAX_DEPTH = 32  # of a result's nesting
MAX_ITEMS = 100_000  # values in one result: a larger one is refused before it is copied, not after
MAX_LINE = 1 << 20  # bytes of one answer


class NotPlain(Exception):
    pass


def plain(value, depth: int = 0, budget: list | None = None):
    """`value` as JSON-able basic types, by exact type: no subclass, no object with its own `__eq__`."""
    budget = [MAX_ITEMS] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise NotPlain(f"more than {MAX_ITEMS} values")
    if depth > MAX_DEPTH:
        raise NotPlain(f"nested deeper than {MAX_DEPTH}")
    kind = type(value)
    if value is None or kind in (bool, str):
        return value
    if kind is int:
        return value
    if kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            raise NotPlain("a float that JSON cannot carry (nan, inf)")
        return value
    if kind in (list, tuple):
        return [plain(v, depth + 1, budget) for v in value]
    if kind is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise NotPlain(f"a dict key of type {type(k).__name__}")
            out[k] = plain(v, depth + 1, budget)
        return out
    raise NotPlain(f"not plain data: {kind.__name__}")


def _line(answer: dict) -> bytes:
    data = json.dumps(answer, allow_nan=False).encode()
    if len(data) > MAX_LINE:
        return json.dumps({"error": f"the result is larger than {MAX_LINE} bytes"}).encode() + b"\n"
    return data + b"\n"


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def main(argv: list[str]) -> None:
    io_dir, workspace = argv[0], argv[1]
    with open(os.path.join(io_dir, "calls.json"), "rb") as f:
        calls = json.load(f)
    out = os.open(os.path.join(io_dir, "answers.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    sys.path.insert(0, workspace)
    for call in calls:
        try:
            module, _, name = call["call"].partition(":")
            fn = getattr(importlib.import_module(module), name)
            answer = {"ok": plain(fn(*call["args"]))}
        except NotPlain as exc:
            answer = {"error": str(exc)}
        except BaseException as exc:  # noqa: BLE001 - the agent's code failed this call, whatever it raised
            try:
                answer = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            except BaseException:  # noqa: BLE001 - even its message raised
                answer = {"error": "an exception that cannot be shown"}
        try:
            line = _line(answer)
        except BaseException:  # noqa: BLE001 - e.g. an int too long to write as text
            line = _line({"error": "the result cannot be written as JSON"})
        _write(out, line)
    os.close(out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
