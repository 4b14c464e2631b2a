"""BFCL multi-turn tasks through the proxy, with BFCL's executable back-ends and state check."""

from harnessrl.harness_examples.bfcl_multiturn.data import (
    BfclTask,
    Backends,
    export_tasks,
    expert_trace,
    load_tasks,
    reference_calls,
    state_check,
)
from harnessrl.harness_examples.bfcl_multiturn.harness import BfclConfig, run_rollout

__all__ = ["BfclConfig", "BfclTask", "Backends", "export_tasks", "expert_trace", "load_tasks",
           "reference_calls", "run_rollout", "state_check"]
