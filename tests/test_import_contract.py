"""The import contract: data flows one way, and each part sees only the core.

Read from the real import graph of the installed package: every `import`/`from … import` in
every module (top level or inside a function), `importlib.import_module("…")` with a literal name,
and any `__import__` (forbidden outright). Layers (docs/architecture.md):

    core (harnessrl.*)        ↛ any part, the app
    proxy                     ↛ compiler, trainer, harness_examples, viewer, app
    compiler                  ↛ proxy, trainer, harness_examples, viewer, app
    trainer                   ↛ proxy, compiler, harness_examples, viewer, app
    harness_examples          ↛ proxy, compiler, trainer, viewer, app
    viewer                    ↛ proxy, trainer, harness_examples, app  (reads through core and the compiler)
    app (harnessrl.app)       may import everything

No part imports the viewer; only the app (the `ui` command, the proxy's `/ui/` mount) does.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no server, database or training: also run on Python 3.12 in CI

PARTS = ("proxy", "compiler", "trainer", "harness_examples", "viewer", "migrations")
FORBIDDEN = {
    "core": {"proxy", "compiler", "trainer", "harness_examples", "viewer", "app"},
    "proxy": {"compiler", "trainer", "harness_examples", "viewer", "app"},
    "compiler": {"proxy", "trainer", "harness_examples", "viewer", "app"},
    "trainer": {"proxy", "compiler", "harness_examples", "viewer", "app"},
    "harness_examples": {"proxy", "compiler", "trainer", "viewer", "app"},
    "viewer": {"proxy", "trainer", "harness_examples", "app"},
    "migrations": {"proxy", "compiler", "trainer", "harness_examples", "viewer", "app"},
    "app": set(),
}


def layer(module: str) -> str | None:
    """The layer of a `harnessrl…` module name; None outside the package."""
    parts = module.split(".")
    if parts[0] != "harnessrl":
        return None
    if len(parts) == 1:
        return "core"
    if parts[1] in PARTS or parts[1] == "app":
        return parts[1]
    if parts[1] == "__main__":
        return "app"  # `python -m harnessrl` is the app's entry point
    return "core"


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, imported module) for every import in `source`, relative imports resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name == "__import__":
                found.append((node.lineno, "__import__"))
            elif name == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
                found.append((node.lineno, str(node.args[0].value)))
    return found


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    mine = layer(module)
    out, seen = [], set()
    for line, target in imports_of(source, module, is_package):
        if line in seen:
            continue  # one report per import statement (`from a import b` also yields `a.b`)
        if target == "__import__":
            out.append(f"{module}:{line} uses __import__ (use an ordinary import)")
            seen.add(line)
            continue
        theirs = layer(target)
        if theirs and theirs in FORBIDDEN[mine]:
            out.append(f"{module}:{line} imports {target} ({mine} ↛ {theirs})")
            seen.add(line)
    return out


def installed_modules() -> list[tuple[str, Path, bool]]:
    """Every module of the installed package: (name, file, is_package), parts found where the
    package maps them (setuptools package-dir), not by guessing folder names."""
    out = []
    from harnessrl.db import _script_location

    roots = [(name, Path(importlib.util.find_spec(name).submodule_search_locations[0]))
             for name in ("harnessrl", "harnessrl.app", *(f"harnessrl.{p}" for p in PARTS if p != "migrations"))]
    roots.append(("harnessrl.migrations", Path(_script_location())))  # found by path, as the DB layer finds it
    for name, root in roots:
        for file in sorted(root.rglob("*.py")):
            rel = file.relative_to(root).with_suffix("").parts
            if name == "harnessrl" and rel[0] == "app":
                continue  # walked as its own root
            is_package = rel[-1] == "__init__"
            parts = rel[:-1] if is_package else rel
            out.append((".".join((name, *parts)), file, is_package))
    return out


def test_the_package_keeps_the_contract():
    modules = installed_modules()
    names = {m for m, _, _ in modules}
    # the walk really covers every layer (an empty walk would pass vacuously)
    for expected in ("harnessrl.records", "harnessrl.proxy.server", "harnessrl.compiler.trees",
                     "harnessrl.trainer.losses", "harnessrl.harness_examples.chat", "harnessrl.app.loop",
                     "harnessrl.viewer.app"):
        assert expected in names
    found = [v for name, file, pkg in modules for v in violations(file.read_text(), name, pkg)]
    assert not found, "import contract broken:\n" + "\n".join(found)


@pytest.mark.parametrize("module, source, expected", [
    # the violations this contract was written against
    ("harnessrl.tiny_model", "def f():\n    from harnessrl.proxy.toolparse import parse_hermes\n",
     "harnessrl.tiny_model:2 imports harnessrl.proxy.toolparse (core ↛ proxy)"),
    ("harnessrl.records", "import harnessrl.app.loop\n", "harnessrl.records:1 imports harnessrl.app.loop (core ↛ app)"),
    ("harnessrl.trainer.capo", "from harnessrl.compiler.schema import ACTION\n",
     "harnessrl.trainer.capo:1 imports harnessrl.compiler.schema (trainer ↛ compiler)"),
    ("harnessrl.trainer.sft", "from ..compiler import tasks\n",
     "harnessrl.trainer.sft:1 imports harnessrl.compiler (trainer ↛ compiler)"),
    ("harnessrl.compiler.pipeline", "import importlib\nimportlib.import_module('harnessrl.trainer.run')\n",
     "harnessrl.compiler.pipeline:2 imports harnessrl.trainer.run (compiler ↛ trainer)"),
    ("harnessrl.proxy.app", "from harnessrl.compiler import trees\n",
     "harnessrl.proxy.app:1 imports harnessrl.compiler (proxy ↛ compiler)"),
    ("harnessrl.harness_examples.chat", "from harnessrl.proxy.prefix import x\n",
     "harnessrl.harness_examples.chat:1 imports harnessrl.proxy.prefix (harness_examples ↛ proxy)"),
    ("harnessrl.viewer.app", "from harnessrl.proxy.server import run_proxy\n",
     "harnessrl.viewer.app:1 imports harnessrl.proxy.server (viewer ↛ proxy)"),
    ("harnessrl.proxy.app", "from harnessrl.viewer.app import create_viewer\n",
     "harnessrl.proxy.app:1 imports harnessrl.viewer.app (proxy ↛ viewer)"),
    ("harnessrl.compiler.inspect", "import harnessrl.viewer\n",
     "harnessrl.compiler.inspect:1 imports harnessrl.viewer (compiler ↛ viewer)"),
    ("harnessrl.app.loop", "m = __import__('harnessrl.harness_examples.react')\n",
     "harnessrl.app.loop:1 uses __import__ (use an ordinary import)"),
])
def test_each_listed_violation_is_caught(module, source, expected):
    assert expected in violations(source, module)


def test_the_app_and_core_imports_that_are_allowed():
    assert violations("from harnessrl.trainer.run import train\nfrom harnessrl.proxy import server\n",
                      "harnessrl.app.loop") == []
    assert violations("from harnessrl.records import Call\nfrom harnessrl.errors import UserError\n",
                      "harnessrl.compiler.pipeline") == []
    assert violations("from harnessrl.client import HarnessRL\n", "harnessrl.harness_examples.chat") == []
    assert violations("from harnessrl.compiler.trees import build_forest\n", "harnessrl.viewer.rollout") == []
    assert violations("from harnessrl.viewer.app import create_viewer\n", "harnessrl.app.cli") == []
