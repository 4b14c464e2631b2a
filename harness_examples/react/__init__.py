"""Single-agent ReAct harness over the search task (the GRPO baseline setting)."""

from harnessrl.harness_examples.calculator import calculator
from harnessrl.harness_examples.react.harness import ReactConfig, run_rollout

__all__ = ["ReactConfig", "calculator", "run_rollout"]
