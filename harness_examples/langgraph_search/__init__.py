"""The search task written with a third-party agent framework (LangGraph + langchain-openai):
the only harnessrl-specific line is the `base_url` given to `ChatOpenAI`."""

from harnessrl.harness_examples.langgraph_search.harness import LangGraphConfig, build_graph, run_rollout

__all__ = ["LangGraphConfig", "build_graph", "run_rollout"]
