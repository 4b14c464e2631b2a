"""The import contract: data flows one way, and each part sees only the core.

Read from the real import graph of the source tree this file lives in (its pyproject.toml's
package-dir map says which folder is which part), not of whatever `harnessrl` is installed: run
from another checkout's venv, the installed package would be checked instead of the tree being
edited, so the test first checks that the installed package is this tree. Every
`import`/`from … import` in every module (top level or inside a function),
`importlib.import_module("…")` with a literal name, and any `__import__` (forbidden outright).
Layers (docs/architecture.md):

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
import shutil
import tomllib
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


REPO = Path(__file__).resolve().parents[1]


def package_dirs(repo: Path) -> dict[str, Path]:
    """Each package's folder in `repo`, from its pyproject.toml (setuptools package-dir)."""
    setup = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: repo / folder for name, folder in setup["package-dir"].items()}


def tree_modules(repo: Path) -> list[tuple[str, Path, bool]]:
    """Every module of the source tree: (name, file, is_package), each file named after the
    deepest package folder that holds it (alembic/versions/x.py is harnessrl.migrations.versions.x)."""
    named: dict[Path, tuple[str, Path, bool]] = {}
    for name, root in sorted(package_dirs(repo).items(), key=lambda kv: len(kv[1].parts)):
        for file in sorted(root.rglob("*.py")):
            rel = file.relative_to(root).with_suffix("").parts
            is_package = rel[-1] == "__init__"
            parts = rel[:-1] if is_package else rel
            named[file] = (".".join((name, *parts)), file, is_package)
    return sorted(named.values())


def contract_violations(repo: Path) -> list[str]:
    return [v for name, file, pkg in tree_modules(repo) for v in violations(file.read_text(), name, pkg)]


def installed_folder(name: str) -> Path | None:
    """Where the installed `name` is read from."""
    if name.startswith("harnessrl.migrations"):
        # alembic/ has no __init__.py: the DB layer finds it by path, so it is checked that way
        from harnessrl.db import _script_location

        return Path(_script_location(), *name.split(".")[2:]).resolve()
    spec = importlib.util.find_spec(name)
    return Path(spec.submodule_search_locations[0]).resolve() if spec else None


def test_the_installed_package_is_this_tree():
    for name, folder in package_dirs(REPO).items():
        where = installed_folder(name)
        assert where == folder.resolve(), (
            f"`{name}` is imported from {where}, not from this checkout ({folder}): the tests would run "
            f"another tree's code. Run them with this checkout's venv, or `pip install -e {REPO}`.")


def test_the_package_keeps_the_contract():
    names = {m for m, _, _ in tree_modules(REPO)}
    # the walk really covers every layer (an empty walk would pass vacuously)
    for expected in ("harnessrl.records", "harnessrl.proxy.server", "harnessrl.compiler.trees",
                     "harnessrl.trainer.losses", "harnessrl.harness_examples.chat", "harnessrl.app.loop.sync",
                     "harnessrl.viewer.app", "harnessrl.migrations.env"):
        assert expected in names
    found = contract_violations(REPO)
    assert not found, "import contract broken:\n" + "\n".join(found)


def test_a_forbidden_import_in_a_copy_of_the_tree_is_caught(tmp_path):
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    for folder in {f.relative_to(REPO).parts[0] for f in package_dirs(REPO).values()}:
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    trees = tmp_path / "compiler" / "trees.py"
    trees.write_text(trees.read_text() + "\n\ndef _f():\n    from harnessrl.trainer import run\n")
    line = len(trees.read_text().splitlines())
    assert contract_violations(tmp_path) == [
        f"harnessrl.compiler.trees:{line} imports harnessrl.trainer (compiler ↛ trainer)"]


@pytest.mark.parametrize("module, source, expected", [
    # the violations this contract was written against
    ("harnessrl.tiny_model", "def f():\n    from harnessrl.proxy.routes.hermes_tools import parse_hermes\n",
     "harnessrl.tiny_model:2 imports harnessrl.proxy.routes.hermes_tools (core ↛ proxy)"),
    ("harnessrl.records", "import harnessrl.app.loop.sync\n", "harnessrl.records:1 imports harnessrl.app.loop.sync (core ↛ app)"),
    ("harnessrl.trainer.capo", "from harnessrl.compiler.schema import ACTION\n",
     "harnessrl.trainer.capo:1 imports harnessrl.compiler.schema (trainer ↛ compiler)"),
    ("harnessrl.trainer.sft", "from ..compiler import tasks\n",
     "harnessrl.trainer.sft:1 imports harnessrl.compiler (trainer ↛ compiler)"),
    ("harnessrl.compiler.pipeline", "import importlib\nimportlib.import_module('harnessrl.trainer.run')\n",
     "harnessrl.compiler.pipeline:2 imports harnessrl.trainer.run (compiler ↛ trainer)"),
    ("harnessrl.proxy.app", "from harnessrl.compiler import trees\n",
     "harnessrl.proxy.app:1 imports harnessrl.compiler (proxy ↛ compiler)"),
    ("harnessrl.harness_examples.chat", "from harnessrl.proxy.prefix.prompts import x\n",
     "harnessrl.harness_examples.chat:1 imports harnessrl.proxy.prefix.prompts (harness_examples ↛ proxy)"),
    ("harnessrl.viewer.app", "from harnessrl.proxy.server import run_proxy\n",
     "harnessrl.viewer.app:1 imports harnessrl.proxy.server (viewer ↛ proxy)"),
    ("harnessrl.proxy.app", "from harnessrl.viewer.app import create_viewer\n",
     "harnessrl.proxy.app:1 imports harnessrl.viewer.app (proxy ↛ viewer)"),
    ("harnessrl.compiler.inspect", "import harnessrl.viewer\n",
     "harnessrl.compiler.inspect:1 imports harnessrl.viewer (compiler ↛ viewer)"),
    ("harnessrl.app.loop.sync", "m = __import__('harnessrl.harness_examples.react')\n",
     "harnessrl.app.loop.sync:1 uses __import__ (use an ordinary import)"),
])
def test_each_listed_violation_is_caught(module, source, expected):
    assert expected in violations(source, module)


def test_the_app_and_core_imports_that_are_allowed():
    assert violations("from harnessrl.trainer.run import train\nfrom harnessrl.proxy import server\n",
                      "harnessrl.app.loop.sync") == []
    assert violations("from harnessrl.records import Call\nfrom harnessrl.errors import UserError\n",
                      "harnessrl.compiler.pipeline") == []
    assert violations("from harnessrl.client import HarnessRL\n", "harnessrl.harness_examples.chat") == []
    assert violations("from harnessrl.compiler.trees import build_forest\n", "harnessrl.viewer.rollout") == []
    assert violations("from harnessrl.viewer.app import create_viewer\n", "harnessrl.app.cli") == []


# The app layer in rooms (docs/architecture.md, "The app layer's rooms"): no module of harnessrl.app
# imports, however indirectly, one that imports it back, and neither does a room (loop/, rollouts/,
# sandbox/, scoring/) with another: each room reads only the rooms below it.

def import_graph(modules: dict[str, tuple[str, bool]]) -> dict[str, dict[str, str]]:
    """module → {module of `modules` it imports: "module:line" of the first such import}, from
    `modules` (name → (source, is_package)); top-level and function-level imports alike."""
    graph: dict[str, dict[str, str]] = {}
    for name, (source, is_package) in sorted(modules.items()):
        edges = graph.setdefault(name, {})
        for line, target in imports_of(source, name, is_package):
            if target in modules and target != name:
                edges.setdefault(target, f"{name}:{line}")
    return graph


def room_graph(graph: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The same imports between rooms: harnessrl.app.<room>.x is in harnessrl.app.<room>; a module
    directly under harnessrl.app (cli, demo) is a room of its own."""
    def room(module: str) -> str:
        return ".".join(module.split(".")[:3])

    rooms: dict[str, dict[str, str]] = {}
    for name, edges in sorted(graph.items()):
        mine = rooms.setdefault(room(name), {})
        for target, where in sorted(edges.items()):
            if room(target) != room(name):
                mine.setdefault(room(target), where)
    return rooms


def first_cycle(graph: dict[str, dict[str, str]]) -> str | None:
    """The first circle a depth-first walk in name order meets, as `a → b → a (a:3, b:7)` (where each
    import is), or None."""
    done: set[str] = set()
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph.get(node, {})):
            if found := walk(target):
                return found
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        if cycle := walk(start):
            where = ", ".join(graph[a][b] for a, b in zip(cycle, cycle[1:]))
            return f"{' → '.join(cycle)} ({where})"
    return None


def app_graph(repo: Path) -> dict[str, dict[str, str]]:
    return import_graph({name: (file.read_text(), pkg) for name, file, pkg in tree_modules(repo)
                         if name == "harnessrl.app" or name.startswith("harnessrl.app.")})


def test_the_app_layer_has_no_import_circle():
    graph = app_graph(REPO)
    # the walk sees the rooms' imports (an empty graph would pass vacuously)
    assert graph["harnessrl.app.rollouts.limited_run"]["harnessrl.app.sandbox.run"].startswith(
        "harnessrl.app.rollouts.limited_run:")
    rooms = room_graph(graph)
    assert {"harnessrl.app.loop", "harnessrl.app.rollouts", "harnessrl.app.scoring"} <= set(rooms)
    assert "harnessrl.app.sandbox" in rooms["harnessrl.app.scoring"]
    circle = first_cycle(graph)
    assert circle is None, f"import circle in the app layer: {circle}"
    circle = first_cycle(room_graph(graph))
    assert circle is None, f"import circle between the app layer's rooms: {circle}"


def test_a_circle_through_a_function_level_import_is_found_and_named():
    graph = import_graph({
        "harnessrl.app.rollouts": ("", True),
        "harnessrl.app.rollouts.a": ("import os\nfrom harnessrl.app.rollouts.b import f\n", False),
        "harnessrl.app.rollouts.b": ("def f():\n    from . import c\n", False),
        "harnessrl.app.rollouts.c": ("from harnessrl.app.rollouts import a\nfrom harnessrl.errors import UserError\n",
                                     False),
    })
    # c's `from harnessrl.app.rollouts import a` is an import of the package too (line 1 of c)
    assert graph["harnessrl.app.rollouts.c"] == {"harnessrl.app.rollouts": "harnessrl.app.rollouts.c:1",
                                                 "harnessrl.app.rollouts.a": "harnessrl.app.rollouts.c:1"}
    assert first_cycle(graph) == (
        "harnessrl.app.rollouts.a → harnessrl.app.rollouts.b → harnessrl.app.rollouts.c → harnessrl.app.rollouts.a "
        "(harnessrl.app.rollouts.a:2, harnessrl.app.rollouts.b:2, harnessrl.app.rollouts.c:1)")


def test_a_circle_between_rooms_is_found_where_no_module_circle_is():
    graph = import_graph({
        "harnessrl.app.rollouts.run": ("from harnessrl.app.sandbox.limits import Limits\n", False),
        "harnessrl.app.sandbox.limits": ("LIMITS = 1\n", False),
        "harnessrl.app.sandbox.launch": ("\n\ndef go():\n    from harnessrl.app.rollouts.keys import key\n", False),
        "harnessrl.app.rollouts.keys": ("KEY = 1\n", False),
        "harnessrl.app.cli": ("from harnessrl.app.rollouts import run\n", False),
    })
    assert first_cycle(graph) is None
    assert first_cycle(room_graph(graph)) == (
        "harnessrl.app.rollouts → harnessrl.app.sandbox → harnessrl.app.rollouts "
        "(harnessrl.app.rollouts.run:1, harnessrl.app.sandbox.launch:4)")
