"""BFCL's own AST checker and tool conversion, imported from the installed `bfcl-eval` although it
is installed without its dependencies (`pip install --no-deps`, scripts/install.sh).

Two of the modules this needs import far more than they use:

- `eval_checker.ast_eval.ast_checker` imports `constants.model_config` for one lookup,
  `MODEL_CONFIG_MAPPING[model].underscore_to_dot` (whether the model's tool names had "." replaced
  by "_"). `model_config` imports every model handler BFCL ships, and with them the SDKs of a dozen
  vendors (anthropic, mistralai, cohere, google-genai, boto3, qwen-agent, writer-sdk, overrides,
  tree-sitter, ...), none of which the checker runs.
- `model_handler.utils` (home of `convert_to_tool`, the OpenAI tool conversion BFCL's FC handlers
  use) imports the Java and JavaScript call parsers, which need tree-sitter grammars; the Python
  categories never parse Java or JavaScript.

So, only where the real module cannot be imported, a stand-in holding just those names is put in
`sys.modules` while the BFCL module is imported, and taken out afterwards: nothing else ever sees
it, the checker's code is BFCL's unchanged, and with the full dependencies installed the real
modules are used.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from harnessrl.errors import UserError

BFCL_VERSION = "2026.3.23"
# BFCL's OpenAI function-calling model entry; the checker reads only its `underscore_to_dot` (True):
# the names of OpenAI tools cannot hold ".", so `convert_to_tool` sent "math.factorial" as
# "math_factorial" and the checker expects the latter.
CHECKER_MODEL = "gpt-4.1-2025-04-14-FC"


def _unsupported(language: str):
    def parse(*_args: Any, **_kwargs: Any):
        raise RuntimeError(f"{language} calls are not parsed here (BFCL's parser needs tree-sitter)")
    return parse


def _stand_ins() -> dict[str, tuple[tuple[str, ...], dict[str, Any]]]:
    """module → (what it cannot import without, the names its stand-in holds). Saying up front that
    a dependency is missing skips a failing attempt that would first import the anthropic SDK (3 s)."""
    return {
        "bfcl_eval.constants.model_config": (  # every model handler imports tree-sitter and overrides
            ("tree_sitter", "tree_sitter_java", "tree_sitter_javascript", "overrides"),
            {"MODEL_CONFIG_MAPPING": {CHECKER_MODEL: types.SimpleNamespace(underscore_to_dot=True)}}),
        "bfcl_eval.model_handler.parser.java_parser": (
            ("tree_sitter", "tree_sitter_java"), {"parse_java_function_call": _unsupported("Java")}),
        "bfcl_eval.model_handler.parser.js_parser": (
            ("tree_sitter", "tree_sitter_javascript"), {"parse_javascript_function_call": _unsupported("JavaScript")}),
    }


@contextmanager
def _standing_in(names: list[str]) -> Iterator[list[str]]:
    """Stand-ins for those of `names` that cannot be imported; removed again on exit."""
    placed = []
    for name in names:
        needed, attrs = _stand_ins()[name]
        try:
            if any(importlib.util.find_spec(m) is None for m in needed):
                raise ImportError(f"{name} needs {', '.join(needed)}")
            importlib.import_module(name)
        except ImportError:  # a missing SDK anywhere under it
            module = types.ModuleType(name, "harnessrl stand-in (harness_examples/bfcl_single/bfcl_imports.py)")
            module.__dict__.update(attrs)
            sys.modules[name] = module
            placed.append(name)
    try:
        yield placed
    finally:
        for name in placed:
            sys.modules.pop(name, None)


_IMPORTING = threading.Lock()  # rollout threads may ask at once; the stand-ins are process-wide


def bfcl() -> types.SimpleNamespace:
    """BFCL's functions harnessrl uses, and which stand-ins their import needed."""
    with _IMPORTING:
        return _bfcl()


@cache
def _bfcl() -> types.SimpleNamespace:
    try:
        import bfcl_eval  # noqa: F401
    except ModuleNotFoundError:
        raise UserError(f"bfcl-eval is not installed: pip install --no-deps bfcl-eval=={BFCL_VERSION}") from None
    with _standing_in(list(_stand_ins())) as placed:
        ast_checker = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
        handler_utils = importlib.import_module("bfcl_eval.model_handler.utils")
    from bfcl_eval import utils
    from bfcl_eval.constants.enums import Language, ModelStyle
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    return types.SimpleNamespace(
        ast_checker=ast_checker.ast_checker, Language=Language,
        convert_to_tool=lambda functions: handler_utils.convert_to_tool(
            functions, GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS),
        add_hint=utils.add_language_specific_hint_to_function_doc,
        is_call_list=utils.is_function_calling_format_output, stand_ins=tuple(placed))
