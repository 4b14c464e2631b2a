"""Planner–worker search harness (Harness-RL / MATPO setting): a planner dispatches search
sub-agents as a tool; each worker has its own context, searches a BM25 index over several
turns and ends with a summary that returns to the planner as the tool result."""

from harnessrl.harness_examples.planner_worker.harness import PlannerWorkerConfig, run_rollout

__all__ = ["PlannerWorkerConfig", "run_rollout"]
