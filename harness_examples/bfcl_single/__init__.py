"""BFCL single-turn AST categories through the proxy, scored by BFCL's own AST checker."""

from harnessrl.harness_examples.bfcl_single.checker import check, decode
from harnessrl.harness_examples.bfcl_single.data import (
    CATEGORIES,
    BfclSingleTask,
    choose,
    is_held_out,
    load_tasks,
    openai_tools,
    reference_calls,
    split,
)
from harnessrl.harness_examples.bfcl_single.harness import BfclSingleConfig, run_rollout

__all__ = ["CATEGORIES", "BfclSingleConfig", "BfclSingleTask", "check", "choose", "decode", "is_held_out",
           "load_tasks", "openai_tools", "reference_calls", "run_rollout", "split"]
