"""Loading a user's own function named as `module:function` (a reward function, a harness)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from harnessrl.errors import UserError


def load_function(spec: str, what: str) -> Callable[..., Any]:
    """The callable `spec` names; `what` ("reward function", "--harness") words the error."""
    module_name, sep, attr = spec.partition(":")
    if not (sep and module_name and attr):
        raise UserError(f"{what} {spec!r}: expected module:function")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"{what} {spec!r}: cannot load it ({exc})") from None
    if not callable(fn):
        raise UserError(f"{what} {spec!r}: {attr} is not callable")
    return fn
