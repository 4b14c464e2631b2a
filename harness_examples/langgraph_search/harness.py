"""A LangGraph tool-calling agent over the BM25 search tool, as a LangGraph user writes it:
an `agent` node (ChatOpenAI with the tool bound) and a `tools` node (ToolNode), looping until
the model stops calling tools. harnessrl only supplies the rollout's base URL; the reward is
reported through the client afterwards.

Needs the `examples` extra (`pip install harnessrl[examples]`)."""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.client import HarnessRL
from harnessrl.errors import UserError
from harnessrl.harness_examples.chat import RolloutResult, harnessrl_client, make_client, resolve_model
from harnessrl.harness_examples.fictional_world import QA
from harnessrl.harness_examples.search_task import SearchEnv, score
from harnessrl.harness_examples.text_metrics import extract_answer

SYSTEM = (
    "Answer the question. Use the search tool to look up facts, searching again for each new "
    "entity you find, and finish with <answer>the answer</answer>."
)


@dataclass
class LangGraphConfig:
    model: str | None = None  # None: the model the proxy serves
    max_turns: int = 6  # agent steps; LangGraph's recursion limit is derived from it
    max_tokens: int = 256
    temperature: float = 1.0
    reward: str = "f1"  # f1 | em


def build_graph(llm, env: SearchEnv):
    """The agent graph: START → agent ⇄ tools → END."""
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @tool
    def search(query: str) -> str:
        """Search the document collection; returns the best matching documents."""
        return env.search(query)

    model = llm.bind_tools([search])

    def agent(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([search], handle_tool_errors=True))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def served_model(base_url: str, api_key: str) -> str:
    client = make_client(base_url, api_key)
    try:
        return resolve_model(client, None)
    finally:
        client.close()


def run_rollout(hrl: HarnessRL | str, env: SearchEnv, task: QA, cfg: LangGraphConfig | None = None, *,
                group_id: str | None = None, run: str | None = None) -> RolloutResult:
    try:
        import openai
        from langchain_openai import ChatOpenAI
        from langgraph.errors import GraphRecursionError
    except ImportError:
        raise UserError("the langgraph example needs: pip install 'harnessrl[examples]'") from None
    cfg = cfg or LangGraphConfig()
    with harnessrl_client(hrl) as hrl_client, hrl_client.rollout(
            task_id=task.id, group_id=group_id or task.id, run=run, metadata={"harness": "langgraph_search"}) as ro:
        model = cfg.model or served_model(ro.base_url("agent"), ro.api_key("agent"))
        llm = ChatOpenAI(base_url=ro.base_url("agent"), api_key=ro.api_key("agent"), model=model,
                         max_tokens=cfg.max_tokens, temperature=cfg.temperature, max_retries=0)
        graph = build_graph(llm, env)
        answer, error, messages = "", None, []
        try:
            # Stream the state so the messages so far survive a recursion-limit stop.
            for state in graph.stream({"messages": [("system", SYSTEM), ("user", task.question)]},
                                      {"recursion_limit": 2 * cfg.max_turns}, stream_mode="values"):
                messages = state["messages"]
            last = messages[-1].content
            answer = extract_answer(last if isinstance(last, str) else "")
        except GraphRecursionError:
            error = f"no answer within {cfg.max_turns} agent steps"
        except openai.BadRequestError as exc:
            error = str(exc)
        scores = score(answer, task)
        ro.reward(scores[cfg.reward])
        tool_msgs = [m for m in messages if m.type == "tool"]
        metrics = {**scores, "success": scores["em"], "model_calls": sum(m.type == "ai" for m in messages),
                   "tool_calls": len(tool_msgs), "tool_errors": sum(getattr(m, "status", "") == "error" for m in tool_msgs)}
        return RolloutResult(ro.id, task.id, scores[cfg.reward], answer, metrics, error)
