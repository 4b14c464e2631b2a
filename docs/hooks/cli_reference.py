"""The CLI reference page, built from the `harnessrl` Typer app at every `mkdocs build`.

The page is generated (mkdocs' `File.generated`), never committed, so it cannot drift from the
CLI: every command and sub-command, its usage, arguments and options with their defaults and
help, grouped by their help panels as `--help` groups them. `tests/test_docs_cli_reference.py`
checks it against the registered commands."""

from __future__ import annotations

import re
from typing import Any

import typer

PAGE = "cli.md"
_INTRO = """# CLI reference

Generated from the `harnessrl` command itself when this site is built
(`docs/hooks/cli_reference.py`): what `harnessrl COMMAND --help` prints, for every command.
"""


def root_command() -> Any:
    # imported here: the app imports every part, which a test may not need for its other checks
    from harnessrl.app.cli import app

    return typer.main.get_command(app)


# Typer builds its commands on its own copy of click (typer._click), so they are told apart by what
# they have: a group lists sub-commands, an argument's param_type_name is "argument".
def walk(command: Any, name: str = "harnessrl", parent: Any = None):
    """(context, command) for the command and each sub-command under it, in `--help` order; the
    context's `command_path` is the full command line (`harnessrl db upgrade`)."""
    ctx = command.context_class(command, info_name=name, parent=parent, obj={})
    yield ctx, command
    if hasattr(command, "list_commands"):
        for sub_name in command.list_commands(ctx):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                yield from walk(sub, sub_name, ctx)


_SPECIAL = re.compile(r"([\\*_\[\]<>|#])")


def _text(text: str) -> str:
    """Help text as Markdown table-cell text: one line, backticked code kept, the rest escaped
    (help strings hold `|` between choices, `<placeholders>` and `*` patterns)."""
    text = " ".join(text.split())
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: escape it all
        parts = ["\\`".join(parts)]
    out = []
    for i, part in enumerate(parts):
        # a `|` ends a table cell even inside a code span
        out.append(f"`{part.replace('|', '&#124;')}`" if i % 2 else _SPECIAL.sub(r"\\\1", part))
    return "".join(out)


def _panel(param: Any) -> str:
    panel = getattr(param, "rich_help_panel", None)
    return panel or ("Arguments" if param.param_type_name == "argument" else "Options")


def _params(ctx: Any) -> list[str]:
    panels: dict[str, list[str]] = {}
    for param in ctx.command.get_params(ctx):
        if param.name == "help":
            continue
        record = param.get_help_record(ctx)
        if record is None:  # hidden
            continue
        names, help_text = record
        panels.setdefault(_panel(param), []).append(
            f"| `{names.replace('|', '&#124;')}` | {_text(help_text)} |")
    lines: list[str] = []
    for panel, rows in panels.items():
        lines += [f"**{panel}**", "", "| option | help |", "|---|---|", *rows, ""]
    return lines


def _subcommands(ctx: Any) -> list[str]:
    command = ctx.command
    if not hasattr(command, "list_commands"):
        return []
    panels: dict[str, list[str]] = {}
    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        if sub is None or sub.hidden:
            continue
        anchor = anchor_of(ctx.command_path.split() + [name])
        panel = getattr(sub, "rich_help_panel", None) or "Commands"
        panels.setdefault(panel, []).append(
            f"| [`{name}`](#{anchor}) | {_text(sub.get_short_help_str(limit=300))} |")
    lines: list[str] = []
    for panel, rows in panels.items():
        lines += [f"**{panel}**", "", "| command | what it does |", "|---|---|", *rows, ""]
    return lines


def anchor_of(path: list[str]) -> str:
    return "-".join(path)


def render() -> str:
    out = [_INTRO]
    for ctx, command in walk(root_command()):
        path = ctx.command_path.split()
        level = "#" * min(len(path) + 1, 4)
        out.append(f"{level} `{ctx.command_path}` {{#{anchor_of(path)}}}\n")
        if command.help:
            out.append(_text_block(command.help) + "\n")
        usage = " ".join(command.collect_usage_pieces(ctx))
        out.append(f"```text\n{ctx.command_path} {usage}\n```\n")
        out += _subcommands(ctx)
        out += _params(ctx)
    return "\n".join(out)


def _text_block(text: str) -> str:
    """A command's docstring as paragraphs (Typer keeps it as written: blank lines part them)."""
    return "\n\n".join(_text(p) for p in re.split(r"\n\s*\n", text.strip()))


def on_files(files, config):
    """mkdocs hook: add the generated page (mkdocs.yml `hooks:`)."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files
