"""The coding task family: small Python repositories, each with a bug to fix or a function to write.

Offline and reproducible: a seed and a salt give the same files. The salt is the secret part:
`harnessrl tasks coding` draws a fresh one unless `--salt` is given and writes it nowhere, so the
generator installed where a sandboxed agent can read it cannot replay a task's constants, hidden
cases or reference (docs/coding.md, "What a sandbox can read"). A task is one tasks-file row
(harnessrl/tasks_file.py) with inline trees: `workspace` (a package with the function and a
helper module, visible tests in tests/, a README), `hidden_tests` (the visible cases and more:
by default as data, `hidden_tests/calls.json` — each case a call, its arguments and the expected
result — which the scorer keeps outside the sandbox that runs the agent's code
(app/scoring/calls.py); with `hidden="pytest"`, a pytest file laid over the workspace for the
reward, the clean room's mode for tasks that must keep pytest files) and `reference` (the fixed module,
what a solution looks like: scripted agents and checks use it). Train and held-out tasks come
from separate random streams, and no training task shares a held-out task's (template, kind,
constants, names) signature: what is held out is new code, not new inputs to the same code.

    harnessrl tasks coding --out DIR --n-train 32 --n-eval 8 --seed 0 [--salt SECRET]
"""

from __future__ import annotations

import json
import random
import secrets
from pathlib import Path
from typing import Any

from harnessrl.errors import UserError
from harnessrl.harness_examples.coding.templates import TEMPLATES, Template

PACKAGES = ("textkit", "numtools", "listops", "toolbelt", "minilib", "corekit", "smallutils", "pyaux")
VISIBLE, HIDDEN = 3, 8  # cases per test file
HELPERS = '''"""Helpers the package's modules may use."""


def is_even(n):
    return n % 2 == 0


def words(text):
    return text.split()
'''


def _module(fn: str, params: str, doc: str, body: str) -> str:
    return f'"""Part of the package."""\n\n\ndef {fn}({params}):\n    """{doc}"""\n{body}\n'


def _call(fn: str, args: tuple) -> str:
    return f"{fn}({', '.join(repr(a) for a in args)})"


# the tests compare by type, then value: `==` alone is the returned object's own __eq__, and an
# object whose __eq__ always says True would pass every case (ints and floats compare as numbers)
SAME = '''

def same(got, want):
    if isinstance(want, (list, tuple)):
        return type(got) is type(want) and len(got) == len(want) and all(map(same, got, want))
    if isinstance(want, dict):
        return type(got) is dict and len(got) == len(want) and all(
            type(k) in (str, int) and k in want and same(got[k], want[k]) for k in got)
    if type(want) in (int, float):
        return type(got) in (int, float) and got == want
    return type(got) is type(want) and got == want
'''


def _tests(pkg: str, mod: str, fn: str, cases: list[tuple[tuple, Any]]) -> str:
    rows = "".join(f"    ({args!r}, {expected!r}),\n" for args, expected in cases)
    return (f"import pytest\n\nfrom {pkg}.{mod} import {fn}\n\nCASES = [\n{rows}]\n{SAME}\n\n"
            # ids by position: values in the node ids would show the expected answers to whoever sees the ids
            f"@pytest.mark.parametrize(\"args, expected\", CASES, ids=[f\"case{{i}}\" for i in range(len(CASES))])\n"
            f"def test_{fn}(args, expected):\n    got = {fn}(*args)\n    assert same(got, expected), (got, expected)\n")


def _calls(pkg: str, mod: str, fn: str, cases: list[tuple[tuple, Any]]) -> str:
    """The cases as data (app/scoring/calls.py), a line each; ids by position, as the pytest file's."""
    rows = [json.dumps({"id": f"case{i}", "call": f"{pkg}.{mod}:{fn}", "args": list(args), "expected": expected,
                        "compare": "exact"}) for i, (args, expected) in enumerate(cases)]
    return '{"format": "harnessrl-calls/1", "cases": [\n' + ",\n".join(rows) + "\n]}\n"


def _compile(fn: str, params: str, body: str):
    space: dict[str, Any] = {}
    exec(f"def {fn}({params}):\n{body}\n", space)  # noqa: S102 - the template's own code, to compute expectations
    return space[fn]


def _cases(rng: random.Random, t: Template, consts: dict, n: int) -> list[tuple]:
    out: list[tuple] = []
    for _ in range(n * 20):
        args = t.sample(rng, consts)
        if args not in out:
            out.append(args)
        if len(out) == n:
            break
    return out


def _task(rng: random.Random, t: Template, kind: str, task_id: str,
          hidden_as: str = "calls") -> tuple[tuple, dict] | None:
    consts = t.consts(rng)
    fn, mod, pkg = rng.choice(t.names), rng.choice(t.modules), rng.choice(PACKAGES)
    fixed_body, doc = t.fixed.format(**consts), t.doc.format(**consts)
    good = _compile(fn, t.params, fixed_body)
    cases = _cases(rng, t, consts, VISIBLE + HIDDEN)
    if len(cases) < VISIBLE + HIDDEN:
        return None
    expected = [(args, good(*args)) for args in cases]
    visible, hidden = expected[:VISIBLE], expected  # hidden: the visible cases and more
    if kind == "bug":
        body = t.broken.format(**consts)
        bad = _compile(fn, t.params, body)

        def fails(case: tuple) -> bool:
            try:
                return bad(*case[0]) != case[1]
            except Exception:  # noqa: BLE001 - a crash is a failure too
                return True

        failing = [c for c in visible if fails(c)]
        if not failing or not any(fails(c) for c in hidden[VISIBLE:]):
            return None  # this draw's inputs do not show the bug: draw again
        shown = failing[0]
        goal = (f"`{fn}` in `{pkg}/{mod}.py` has a bug: `{_call(fn, shown[0])}` should return "
                f"`{shown[1]!r}`. Fix it so that it does what its docstring says.")
    else:
        body = "    raise NotImplementedError"
        goal = f"`{fn}` in `{pkg}/{mod}.py` is not written yet. Implement it as its docstring says."
    statement = (f"The repository in your working directory is a small Python package, `{pkg}`. {goal} "
                 f"The visible tests are in tests/ (run `python -m pytest -q tests`); hidden tests will also "
                 f"check your change. Change the code, not the tests.")
    workspace = {f"{pkg}/__init__.py": "", f"{pkg}/{mod}.py": _module(fn, t.params, doc, body),
                 f"{pkg}/helpers.py": HELPERS, f"tests/test_{mod}.py": _tests(pkg, mod, fn, visible),
                 "README.md": f"# {pkg}\n\n{statement}\n"}
    row = {"id": task_id, "input": statement,
           "reference": {f"{pkg}/{mod}.py": _module(fn, t.params, doc, fixed_body)},
           "workspace": workspace,
           "hidden_tests": {"hidden_tests/calls.json": _calls(pkg, mod, fn, hidden)} if hidden_as == "calls" else
           {f"hidden_tests/test_{mod}_hidden.py": _tests(pkg, mod, fn, hidden)},
           "family": t.family, "kind": kind}
    signature = (t.family, kind, json.dumps(consts, sort_keys=True), fn, mod, pkg)
    return signature, row


def _draw(stream: str, n: int, avoid: set, prefix: str, hidden_as: str) -> tuple[list[dict], set]:
    """n rows cycling through the templates and both kinds; none with a signature in `avoid`."""
    rng = random.Random(stream)
    rows: list[dict] = []
    made_sigs: set = set()
    for _ in range(n * 200):
        if len(rows) == n:
            break
        i = len(rows)
        made = _task(rng, TEMPLATES[i % len(TEMPLATES)], ("bug", "missing")[(i // len(TEMPLATES) + i) % 2],
                     f"{prefix}-{i:04d}", hidden_as)
        if made is not None and made[0] not in avoid:
            made_sigs.add(made[0])
            rows.append(made[1])
    if len(rows) < n:
        raise UserError(f"cannot make {n} {prefix} tasks distinct from the other set: ask for fewer")
    return rows, made_sigs


def new_salt() -> str:
    return secrets.token_hex(16)


def generate(n_train: int, n_eval: int, seed: int = 0, salt: str | None = None,
             hidden: str = "calls") -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows): tasks-file rows with inline workspace and hidden tests.
    `salt`: None draws a fresh one, so only a caller that keeps its salt can make the same rows again.
    `hidden`: calls (the hidden cases as data) | pytest (as a pytest file); the same cases either way."""
    if hidden not in ("calls", "pytest"):
        raise UserError(f"hidden tests as {hidden!r}: use calls | pytest")
    salt = new_salt() if salt is None else salt
    # the held-out set first: fixed by the seed and salt alone, whatever --n-train is
    held, held_sigs = _draw(f"coding-eval-{seed}-{salt}", n_eval, set(), "coding-eval", hidden)
    return _draw(f"coding-train-{seed}-{salt}", n_train, held_sigs, "coding-train", hidden)[0], held


def write(out: Path, n_train: int, n_eval: int, seed: int = 0, salt: str | None = None,
          hidden: str = "calls") -> dict[str, Path]:
    """OUT/coding.jsonl (training rows, then held-out rows), OUT/train.jsonl, OUT/eval.jsonl. The salt
    is not written: the rows are the record, and the folder is hidden from every sandbox."""
    train, held = generate(n_train, n_eval, seed, salt, hidden)
    out.mkdir(parents=True, exist_ok=True)
    files = {"all": out / "coding.jsonl", "train": out / "train.jsonl", "eval": out / "eval.jsonl"}
    for key, rows in (("all", train + held), ("train", train), ("eval", held)):
        files[key].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return files
