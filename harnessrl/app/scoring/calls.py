"""Hidden tests as data, decided where the agent's code never runs (issue 54, item 1).

A task whose `hidden_tests` tree is a single `hidden_tests/calls.json` (the generated coding
family's, `harness_examples/coding/tasks.py`) is scored from data, not pytest files:

    {"format": "harnessrl-calls/1",
     "cases": [{"id": "case0", "call": "pkg.module:function", "args": [1, 2], "expected": 3,
                "compare": "exact"}, ...]}

- The **child** (evaluator.py, standard library only) runs in a fresh sandbox over the clean room
  (the task's workspace with the agent's solution surface; the calls file is never laid there):
  it is given each case's call and arguments only, imports the target from the workspace, and
  writes each result as plain data (JSON of exact basic types) to an answers file. It never holds
  an expected value, a comparison or a key; an object equal to everything cannot cross as data.
- The **parent** (this module, in the host process, outside the sandbox's pid namespace: the child
  cannot signal, trace or read it) reads the answers as hostile data — at most ANSWERS_LIMIT
  bytes, one line per case in order, each size- and depth-limited — and compares each with the
  expected value by `same`. A case with no answer (a crash, a hang, `os._exit`), an error, or an
  answer that is not plain data fails; the others count, whatever the child's exit.

The reward is the cases passed over the cases (all-pass: 1 when every one did). The task's cases
are checked when it is loaded: with an inline reference, every case must pass on it.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.app.sandbox.run import Limits
from harnessrl.app.scoring import hostile
from harnessrl.app.scoring.sandboxed import clean_env, read_back, run_sandboxed
from harnessrl.app.scoring.workspace import OUTPUT_KEPT, TestOutcome
from harnessrl.errors import UserError

FORMAT = "harnessrl-calls/1"
CALLS_FILE = "hidden_tests/calls.json"
EVALUATOR = Path(__file__).with_name("evaluator.py")
COMPARISONS = ("exact",)
ANSWERS_LIMIT = 16 << 20  # bytes of answers read back
LINE_LIMIT = (1 << 20) + 64  # bytes of one answer (the child writes at most 1 MiB of result)
_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Case:
    id: str
    call: str  # "package.module:function"
    args: tuple
    expected: Any
    compare: str = "exact"


def calls_text(tree: Any) -> str | None:
    """The calls file's text when `tree` is a data-test tree (only `hidden_tests/calls.json`), else None."""
    if isinstance(tree, dict):
        return tree[CALLS_FILE] if set(tree) == {CALLS_FILE} else None
    if isinstance(tree, Path):
        folder = tree / "hidden_tests"
        files = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
        if [p.relative_to(tree).as_posix() for p in files] == [CALLS_FILE]:
            return files[0].read_text()
    return None


def read_cases(tree: Any, where: str) -> tuple[Case, ...] | None:
    """The tree's cases, checked (one line for a bad file); None when the tree holds pytest files."""
    text = calls_text(tree)
    if text is None:
        return None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{where}: {CALLS_FILE} is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("cases"), list) \
            or not doc["cases"]:
        raise UserError(f"{where}: {CALLS_FILE}: want {{\"format\": \"{FORMAT}\", \"cases\": [...]}} with cases")
    out: list[Case] = []
    for i, c in enumerate(doc["cases"]):
        ok = isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("call"), str) \
            and _TARGET.match(c["call"]) and isinstance(c.get("args"), list) and "expected" in c \
            and c.get("compare", "exact") in COMPARISONS
        if not ok:
            raise UserError(f"{where}: {CALLS_FILE} case {i}: want id, call (\"pkg.module:function\"), args (a list), "
                            f"expected, compare ({' | '.join(COMPARISONS)})")
        out.append(Case(c["id"], c["call"], tuple(c["args"]), c["expected"], c.get("compare", "exact")))
    if len({c.id for c in out}) != len(out):
        raise UserError(f"{where}: {CALLS_FILE}: case ids repeat")
    return tuple(out)


def same(got: Any, want: Any) -> bool:
    """Exact comparison of plain data: the same JSON type all the way down (ints and floats compare
    as numbers, a bool is not a number), equal values."""
    if isinstance(want, list):
        return type(got) is list and len(got) == len(want) and all(map(same, got, want))
    if isinstance(want, dict):
        return type(got) is dict and set(got) == set(want) and all(same(got[k], want[k]) for k in want)
    if type(want) in (int, float):
        return type(got) in (int, float) and got == want
    return type(got) is type(want) and got == want


@dataclass
class CallsRun:
    done: Any  # sandbox.run.Finished
    output: str
    answers: list[Any]  # per case: {"ok": value} | {"error": str} | None (no answer, or garbage)
    status: str  # read | missing | unreadable


def _answers(raw: bytes | None, n: int) -> list[Any]:
    out: list[Any] = []
    for line in (raw or b"")[:ANSWERS_LIMIT].split(b"\n")[:n]:
        try:
            answer = hostile.loads(line, LINE_LIMIT)
        except hostile.HostileData:
            answer = None
        ok = isinstance(answer, dict) and len(answer) == 1 and ("ok" in answer or isinstance(answer.get("error"), str))
        out.append(answer if ok else None)
    return out + [None] * (n - len(out))


def run_calls(clean: Path, cases: tuple[Case, ...], limits: Limits, hidden: tuple[Path, ...]) -> CallsRun:
    """The child over the clean room, in a fresh sandbox: given the calls, never the expected values."""
    io = clean / f".score-{secrets.token_hex(8)}"
    io.mkdir()
    try:
        for private in ("home", "tmp"):
            (io / private).mkdir()
        (io / "calls.json").write_text(json.dumps([{"call": c.call, "args": list(c.args)} for c in cases]))
        argv = [sys.executable, "-I", "-B", str(EVALUATOR), str(io), str(clean)]
        done, output = run_sandboxed(argv, clean, clean_env(io / "home", io / "tmp"), limits, hidden)
        raw, status = read_back(io, "answers.jsonl", ANSWERS_LIMIT)
        return CallsRun(done, output, _answers(raw, len(cases)), status)
    finally:
        shutil.rmtree(io, ignore_errors=True)


def _shown(value: Any) -> str:
    return hostile.safe_text(json.dumps(value)[:200] if value is not None else "null", 200)


def calls_verdict(cases: tuple[Case, ...], run: CallsRun, mode: str) -> TestOutcome:
    """The reward of the child's answers against the parent's expected values; a line per case."""
    lines, passed = [], 0
    for case, answer in zip(cases, run.answers):
        if answer is None:
            lines.append(f"{case.id} failed: no answer")
        elif "error" in answer:
            lines.append(f"{case.id} failed: {hostile.safe_text(answer['error'], 200)}")
        elif same(answer["ok"], case.expected):
            passed += 1
            lines.append(f"{case.id} passed")
        else:
            lines.append(f"{case.id} failed: got {_shown(answer['ok'])}, want {_shown(case.expected)}")
    done, n = run.done, len(cases)
    lines.append(f"{passed} passed, {n - passed} failed in {done.seconds:.2f}s")
    output = run.output[-OUTPUT_KEPT // 2:] + "\n" + "\n".join(lines)
    meta: dict[str, Any] = {"mode": mode, "tests": "calls", "exit_code": done.code, "timed_out": done.timed_out,
                            "seconds": round(done.seconds, 3), "known": n, "report": run.status, "passed": passed,
                            "errors": 0, "failed": n - passed, "output": output[-OUTPUT_KEPT:]}
    reward = (1.0 if passed == n else 0.0) if mode == "all-pass" else passed / n
    return TestOutcome(reward, meta)


_checked: dict[str, tuple[str, ...]] = {}


def known_cases(task: Any, cases: tuple[Case, ...], reference: dict[str, str] | None, where: str,
                clean_room: Any, limits: Limits) -> tuple[str, ...]:
    """The case ids; with an inline reference, every case run on it and passing (one line if not).
    `clean_room`: hidden_tests.clean_room (passed in: that module imports this one)."""
    ids = tuple(c.id for c in cases)
    if reference is None:
        return ids
    key = hashlib.sha256(json.dumps([task.workspace if isinstance(task.workspace, dict) else str(task.workspace),
                                     calls_text(task.hidden_tests), reference, EVALUATOR.read_text()],
                                    sort_keys=True).encode()).hexdigest()
    if key in _checked:
        return _checked[key]
    clean, _ = clean_room(task, None, reference)
    try:
        run = run_calls(clean, cases, limits, ())
    finally:
        shutil.rmtree(clean, ignore_errors=True)
    outcome = calls_verdict(cases, run, "pass-fraction")
    if outcome.reward != 1.0:
        first = next((ln for ln in outcome.metadata["output"].splitlines() if " failed: " in ln), "?")
        raise UserError(f"{where}: {outcome.metadata['failed']} of its {len(cases)} hidden tests do not pass on its "
                        f"reference (first: {first[:200]})")
    _checked[key] = ids
    return ids
