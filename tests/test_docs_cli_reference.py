"""The docs site's CLI reference (docs/hooks/cli_reference.py, run by `mkdocs build`) lists every
registered command and every option, so the page cannot drift from the CLI."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import typer

from harnessrl.app.cli import app

pytestmark = pytest.mark.unit  # no server, database or training

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "docs/hooks/cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page() -> str:
    return _generator().render()


def _registered(typer_app: typer.Typer, prefix: str = "harnessrl") -> set[str]:
    """Every command path, read from the Typer app's own registrations (not from click's view
    of it, which the generator walks)."""
    paths = {prefix}
    for info in typer_app.registered_commands:
        paths.add(f"{prefix} {info.name or info.callback.__name__.replace('_', '-')}")
    for group in typer_app.registered_groups:
        paths |= _registered(group.typer_instance, f"{prefix} {group.name}")
    return paths


def _section(page: str, path: str) -> str:
    """The page's text for one command: from its heading to the next heading."""
    match = re.search(rf"^#+ `{re.escape(path)}` \{{#[^}}]+\}}\n(.*?)(?=^#+ `harnessrl|\Z)", page, re.M | re.S)
    assert match, f"no section for {path}"
    return match.group(1)


def test_every_registered_command_and_sub_command_has_a_section(page):
    registered = _registered(app)
    headed = set(re.findall(r"^#+ `(harnessrl[^`]*)` \{#", page, re.M))
    assert {"harnessrl proxy", "harnessrl train", "harnessrl run", "harnessrl db upgrade"} <= registered
    assert headed == registered


@pytest.mark.parametrize("command", ["proxy", "train", "loop", "compile"])
def test_every_option_of_a_command_is_listed_with_its_help(page, command):
    click_command = typer.main.get_command(app).commands[command]
    section = _section(page, f"harnessrl {command}")
    params = [p for p in click_command.params if p.name != "help" and not p.hidden]
    assert len(params) > 5
    for param in params:
        for opt in param.opts + param.secondary_opts:
            if opt.startswith("-"):
                assert f"`{opt}" in section or f" {opt}" in section, f"{command}: {opt} missing"
        if param.help:  # the whole help text, as the page's Markdown shows it once unescaped
            shown = section.replace("&#124;", "|").replace("\\", "")
            assert " ".join(param.help.split()) in shown, f"{command}: help of {param.name} missing"


def test_defaults_and_required_are_shown(page):
    loop = _section(page, "harnessrl loop")
    assert re.search(r"`--rounds <int>` \| .*\\\[default: 2\\\]", loop)
    assert re.search(r"`--model <\w+>` \| .*\\\[required\\\]", loop)


def test_links_between_commands_resolve_to_headings(page):
    anchors = set(re.findall(r"\{#([^}]+)\}", page))
    links = set(re.findall(r"\]\(#([^)]+)\)", page))
    assert links and links <= anchors
