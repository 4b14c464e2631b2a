"""The reward: BFCL's own AST checker (bfcl_eval.eval_checker.ast_eval.ast_checker), called as
BFCL's evaluation runner calls it for a function-calling model: the model's tool calls decoded
the way BFCL's OpenAI FC handler decodes them ([{name: json.loads(arguments)}]), checked for that
shape, then against the possible answers with the function docs as shipped."""

from __future__ import annotations

import json
from typing import Any

from harnessrl.harness_examples.bfcl_single.bfcl_imports import CHECKER_MODEL, bfcl
from harnessrl.harness_examples.bfcl_single.data import BfclSingleTask


def decode(tool_calls: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """(name, raw JSON arguments) of each call → BFCL's decoded form; raises on arguments that
    are not JSON, as BFCL's decoder does (the runner scores that as a failed decode)."""
    return [{name: json.loads(raw)} for name, raw in tool_calls]


def check(task: BfclSingleTask, tool_calls: list[tuple[str, str]]) -> dict[str, Any]:
    """BFCL's verdict for one answer: {"valid": bool, "error": [...], "error_type": str}."""
    b = bfcl()
    try:
        decoded = decode(tool_calls)
    except ValueError as exc:
        return {"valid": False, "error": [f"Invalid syntax. Failed to decode AST. {exc}"],
                "error_type": "ast_decoder:decoder_failed"}
    if not b.is_call_list(decoded):
        return {"valid": False, "error": ["Did not output in the specified format."],
                "error_type": "ast_decoder:decoder_wrong_output_format"}
    return b.ast_checker(task.functions, decoded, task.possible_answer, b.Language.PYTHON, task.category,
                         CHECKER_MODEL)
