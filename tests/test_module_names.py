"""Modules are named for what they do (issue 32): `harnessrl compile` is the compiler's pipeline,
`harnessrl inspect` its own module, and core's answer scoring is not a second `metrics` beside the
proxy's Prometheus metrics (a reader of "metrics.py" could not tell which was meant)."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

pytestmark = pytest.mark.unit  # no server, database or training: also run on Python 3.12 in CI


@pytest.mark.parametrize("module, names", [
    ("harnessrl.compiler.pipeline", ("Compiler", "CompileOptions")),  # `harnessrl compile`
    ("harnessrl.compiler.inspect_rollout", ("rollout_tree",)),  # `harnessrl inspect`
    ("harnessrl.answer_match", ("exact_match", "f1", "contains", "normalize_answer")),
])
def test_each_module_is_named_for_what_it_does(module, names):
    mod = importlib.import_module(module)
    assert all(callable(getattr(mod, n, None)) for n in names)


@pytest.mark.parametrize("old", ["harnessrl.compiler.export", "harnessrl.compiler.show", "harnessrl.metrics"])
def test_the_old_names_are_gone(old):
    assert importlib.util.find_spec(old) is None, f"{old} is still there"
