"""Command-line options defined once, on the config dataclass they fill.

A field made with `option(...)` carries its flag, help, help panel, environment variable and
metavar; `from_config(Config)` turns such a dataclass into the parameters of a typer command (as
vLLM's and TRL's config fields carry their own help and generate the CLI), so a flag, its default
and its help cannot drift apart from the field. Fields made with plain `field()` or a bare default
are settings without a flag (a YAML file's, or a library caller's).

An old spelling stays accepted for one release (`deprecated=`): a hidden option that, when used,
prints one line on stderr naming the new spelling and fills the same field.

Core module: every part builds its CLI with it, and core imports no part.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

from harnessrl.algorithms import algo_help
from harnessrl.errors import UserError


@dataclass(frozen=True)
class Flag:
    """How a config field appears on the command line."""

    names: tuple[str, ...]  # "--db", or "--prefix/--no-prefix"
    help: str
    panel: str | None = None  # the help panel it is listed in (typer's rich_help_panel)
    envvar: str | None = None
    metavar: str | None = None
    # the flag's value times `scale` is the field's (a size given in MiB, kept in bytes): the flag is a
    # float, the field an int, and the shown default the field's default divided back
    scale: int | None = None
    deprecated: tuple[str, ...] = ()  # old spellings, still accepted for one release
    required: bool = False  # the command needs it, though a library caller may leave the default


def option(default: Any, *names: str, help: str, panel: str | None = None, envvar: str | None = None,
           metavar: str | None = None, scale: int | None = None, deprecated: tuple[str, ...] = (),
           required: bool = False) -> Any:
    """A dataclass field that is also a command-line option (the flag defaults to --field-name)."""
    flag = Flag(names, help, panel, envvar, metavar, scale, deprecated, required)
    return dataclasses.field(default=default, metadata={"cli": flag})


def flag_of(f: dataclasses.Field) -> Flag | None:
    return f.metadata.get("cli")


def flag_names(cls: type, name: str) -> tuple[str, ...]:
    """The flag spellings of a field, as the generated command accepts them (new first)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    flag = flag_of(f)
    assert flag is not None, f"{cls.__name__}.{name} has no flag"
    return (_names(f, flag)[0].split("/")[0], *flag.deprecated)


def warn_deprecated(old: str, new: str) -> None:
    """The one line an old spelling prints (stderr, so a command's output stays its own)."""
    print(f"warning: {old} is deprecated and will be removed in the next release: use {new}", file=sys.stderr)


def algo_option(default: str | None, lead: str = "", panel: str | None = None) -> Any:
    """The `--algo` option of compile and demo (train's and loop's are their config's field): one
    definition of its long help (each algorithm's summary, from the registry), after the command's own `lead`."""
    return typer.Option(default, "--algo", help=lead + algo_help(), rich_help_panel=panel)


def _names(f: dataclasses.Field, flag: Flag) -> tuple[str, ...]:
    return flag.names or ("--" + f.name.replace("_", "-"),)


def _cli_type(annotation: Any, flag: Flag) -> Any:
    """The type typer parses: a tuple field takes a repeated option (a list), a scaled one a float."""
    if flag.scale is not None:
        return float
    if typing.get_origin(annotation) is tuple:
        return list[typing.get_args(annotation)[0]]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) == 1 and typing.get_origin(inner[0]) is tuple:
            return list[typing.get_args(inner[0])[0]]
    return annotation


@dataclass
class _Spec:
    field: dataclasses.Field
    flag: Flag
    param: str  # the command's parameter name (a field name, prefixed where several classes share one)
    old: list[str]  # the parameter names of the deprecated spellings


def _parameters(cls: type, prefix: str, unset_is_none: bool) -> tuple[list[inspect.Parameter], list[_Spec]]:
    hints = typing.get_type_hints(cls)
    params: list[inspect.Parameter] = []
    specs: list[_Spec] = []
    for f in dataclasses.fields(cls):
        flag = flag_of(f)
        if flag is None:
            continue
        cli_type = _cli_type(hints[f.name], flag)
        if flag.required:
            default = ...
        elif unset_is_none or typing.get_origin(cli_type) is list:
            default = None
        else:
            default = f.default / flag.scale if flag.scale is not None else f.default
        names = _names(f, flag)
        params.append(inspect.Parameter(
            prefix + f.name, inspect.Parameter.KEYWORD_ONLY, annotation=cli_type,
            default=typer.Option(default, *names, help=flag.help, rich_help_panel=flag.panel, envvar=flag.envvar,
                                 metavar=flag.metavar)))
        old = []
        for i, spelling in enumerate(flag.deprecated):
            old.append(f"{prefix}{f.name}__old{i}")
            params.append(inspect.Parameter(
                old[-1], inspect.Parameter.KEYWORD_ONLY, annotation=cli_type,
                default=typer.Option(None, spelling, hidden=True)))
        specs.append(_Spec(f, flag, prefix + f.name, old))
    return params, specs


def _value(spec: _Spec, kwargs: dict[str, Any]) -> Any:
    """The field's value from its parsed options: the new spelling, else a deprecated one (warned)."""
    value = kwargs.pop(spec.param)
    new = _names(spec.field, spec.flag)[0].split("/")[0]
    for name, spelling in zip(spec.old, spec.flag.deprecated):
        old = kwargs.pop(name)
        if old is not None and old != []:
            warn_deprecated(spelling, new)
            if value is None or value == [] or value == spec.field.default:
                value = old
    if isinstance(value, list):
        return tuple(value)
    if value is None and isinstance(spec.field.default, tuple):  # a repeated option given no time
        return spec.field.default
    if spec.flag.scale is not None and value is not None:
        return int(value * spec.flag.scale)
    return value


def from_config(*classes: type, unset_is_none: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command body `body(cfg, ..., **own)` into a typer command whose options are the flagged
    fields of each class (in field order, grouped by panel) followed by the body's own parameters; the
    body gets one instance of each class, then its own parameters.

    `unset_is_none`: every generated option defaults to None and the body gets, instead of an
    instance, a dict of only the values given (for a config that a YAML file fills first, the flags
    overriding it)."""

    def decorate(body: Callable[..., Any]) -> Callable[..., Any]:
        # typer passes every parameter by name: all keyword-only, so the body's own may follow the generated
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
               for p in list(inspect.signature(body, eval_str=True).parameters.values())[len(classes):]]
        generated: list[inspect.Parameter] = []
        specs: list[list[_Spec]] = []
        for i, cls in enumerate(classes):
            params, cls_specs = _parameters(cls, f"c{i}_" if len(classes) > 1 else "", unset_is_none)
            generated += params
            specs.append(cls_specs)

        def command(**kwargs: Any) -> Any:
            configs = []
            for cls, cls_specs in zip(classes, specs):
                values = {spec.field.name: _value(spec, kwargs) for spec in cls_specs}
                configs.append({k: v for k, v in values.items() if v is not None} if unset_is_none else cls(**values))
            return body(*configs, **kwargs)

        command.__name__, command.__doc__, command.__module__ = body.__name__, body.__doc__, body.__module__
        command.__signature__ = inspect.Signature(generated + own)  # type: ignore[attr-defined]
        return command

    return decorate


def old_spelling(spelling: str) -> Any:
    """The hidden option of a hand-written command's deprecated spelling (pass its value to `renamed`)."""
    return typer.Option(None, spelling, hidden=True)


def renamed(value: Any, old_value: Any, old: str, new: str) -> Any:
    """The option's value: the new spelling's, else (warned) the deprecated one's when that was given."""
    if old_value is None:
        return value
    warn_deprecated(old, new)
    return old_value


RECORDS_DB_HELP = "Records DB: SQLite path or postgresql+psycopg:// URL."


def records_db_option(default: str | None = "runs.db", panel: str | None = None) -> Any:
    """`--db`: the records DB, one name in every command."""
    return typer.Option(default, "--db", help=RECORDS_DB_HELP, rich_help_panel=panel)


def positional_db() -> Any:
    """The records DB as the first argument (compile, inspect, traces from-rollouts before `--db`)."""
    return typer.Argument(None, hidden=True, metavar="DB", show_default=False)


def records_db(db: str | None, positional: str | None) -> str:
    """`--db`, else the deprecated positional DB; one of them is required."""
    db = renamed(db, positional, "the records DB as an argument", "--db DB")
    if db is None:
        raise UserError("give the records DB with --db (a SQLite path or postgresql+psycopg:// URL)")
    return db
