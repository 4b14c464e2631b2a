"""Each option defined once: the commands generated from config dataclasses (`harnessrl.cli_options`)
agree with their dataclass, every option has help, and old spellings still work for one release."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from harnessrl.app.cli import app
from harnessrl.cli_options import flag_names, flag_of, from_config, option
from harnessrl.proxy.config import ProxyConfig

pytestmark = pytest.mark.unit


def _commands(group, path: tuple[str, ...] = ()):
    # by duck type: typer 0.29 builds its commands on its own copy of click, not on `click`'s classes
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_every_option_of_every_command_has_help():
    root = typer.main.get_command(app)
    missing = [f"{' '.join(path)} {p.opts[0]}" for path, cmd in _commands(root) for p in cmd.params
               if p.param_type_name == "option" and not p.hidden and not (p.help or "").strip()]
    assert len(list(_commands(root))) >= 18
    assert missing == []



def test_no_help_text_loses_characters_to_rich_markup():
    """`--help` renders help as rich markup: a bracketed word such as http[s] would vanish as a style tag."""
    from rich.text import Text

    root = typer.main.get_command(app)
    helps = [(f"{' '.join(path)} {p.opts[0]}", p.help) for path, cmd in _commands(root) for p in cmd.params
             if p.param_type_name == "option" and p.help]
    assert len(helps) > 100
    assert [name for name, h in helps if Text.from_markup(h).plain != h] == []

def _distinct_argv(cls: type, skip: tuple[str, ...] = ()) -> tuple[list[str], dict[str, typing.Any]]:
    """Argv giving every flagged field of `cls` a value other than its default, and the fields it must fill."""
    hints = typing.get_type_hints(cls)
    argv: list[str] = []
    want: dict[str, typing.Any] = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        flag = flag_of(f)
        if flag is None or f.name in skip:
            continue
        name = flag_names(cls, f.name)[0]
        kind = hints[f.name]
        if kind in (bool, bool | None):
            argv.append(name)
            want[f.name] = True
        elif flag.scale is not None:
            argv += [name, "3.5"]
            want[f.name] = int(3.5 * flag.scale)
        elif typing.get_origin(kind) is tuple:
            argv += [name, f"a{i}", name, f"b{i}"]
            want[f.name] = (f"a{i}", f"b{i}")
        elif kind in (int, int | None):
            argv += [name, str(1000 + i)]
            want[f.name] = 1000 + i
        elif kind in (float, float | None):
            argv += [name, f"{i}.25"]
            want[f.name] = i + 0.25
        elif kind in (Path, Path | None):
            argv += [name, f"p{i}"]
            want[f.name] = Path(f"p{i}")
        else:
            argv += [name, f"v{i}"]
            want[f.name] = f"v{i}"
    return argv, want


class _Served(Exception):
    pass


@pytest.fixture
def served(monkeypatch):
    """`harnessrl proxy`'s config as the command builds it (checks and serving stubbed out)."""
    got: list[ProxyConfig] = []

    def serve(cfg, *_):
        got.append(cfg)
        raise _Served

    # no check (the values are placeholders); the start line names the upstream that check() would set
    monkeypatch.setattr(ProxyConfig, "check", lambda self: setattr(self, "upstream", "http://checked"))
    monkeypatch.setattr("harnessrl.proxy.server.serve", serve)
    monkeypatch.setattr("harnessrl.proxy.logs.configure", lambda *a: None)
    return got


def test_every_proxy_flag_fills_its_config_field(served):
    argv, want = _distinct_argv(ProxyConfig, skip=("upstreams_file",))  # --upstreams FILE excludes --upstream
    assert len(want) >= 35  # every proxy flag is generated from the dataclass
    res = CliRunner().invoke(app, ["proxy", *argv, "--no-ui"])
    assert isinstance(res.exception, _Served), res.output
    cfg = served[0]
    assert {k: getattr(cfg, k) for k in want} == want
    res = CliRunner().invoke(app, ["proxy", "--upstreams", "ups.txt"])
    assert isinstance(res.exception, _Served) and served[1].upstreams_file == "ups.txt"


def test_proxy_defaults_are_the_dataclass_defaults(served):
    res = CliRunner().invoke(app, ["proxy", "--upstream", "http://u:1"])
    assert isinstance(res.exception, _Served), res.output
    assert dataclasses.replace(served[0], upstream=None) == ProxyConfig(upstreams=("http://u:1",))


@dataclasses.dataclass
class _Toy:
    size_bytes: int = option(2048, "--size-kb", scale=1024, help="Size, KiB.", panel="P")
    name: str = option("n", deprecated=("--old-name",), help="A name.")
    tags: tuple[str, ...] = option((), "--tag", help="Tags.")
    hidden_setting: int = 7


def _toy_app(got: list):
    toy = typer.Typer()

    @toy.command()
    @from_config(_Toy)
    def run(cfg: _Toy, extra: int = typer.Option(1, "--extra", help="Own option.")) -> None:
        """A toy command."""
        got.append((cfg, extra))

    return toy


def test_generated_command_converts_scales_tuples_and_keeps_its_own_options():
    got: list = []
    res = CliRunner().invoke(_toy_app(got), ["--size-kb", "0.5", "--tag", "a", "--tag", "b", "--extra", "3"])
    assert res.exit_code == 0, res.output
    assert got == [(_Toy(size_bytes=512, tags=("a", "b")), 3)]
    got.clear()
    CliRunner().invoke(_toy_app(got), [])
    assert got == [(_Toy(), 1)]
    assert "--hidden-setting" not in CliRunner().invoke(_toy_app([]), ["--help"]).output


def test_a_deprecated_spelling_warns_and_fills_the_same_field():
    new: list = []
    old: list = []
    CliRunner().invoke(_toy_app(new), ["--name", "x"])
    res = CliRunner().invoke(_toy_app(old), ["--old-name", "x"])
    assert res.exit_code == 0 and old == new == [(_Toy(name="x"), 1)]
    assert "--old-name is deprecated" in res.stderr and "use --name" in res.stderr
    assert "--old-name" not in CliRunner().invoke(_toy_app([]), ["--help"]).output  # hidden
