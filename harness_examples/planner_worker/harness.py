"""The planner–worker harness. It only speaks OpenAI chat completions to per-agent base URLs
of a proxy rollout, as any harness would; the proxy records every call.

Sessions: the planner is session `planner`; each dispatched worker is session `worker-<n>` of
agent `worker` and names the planner call that dispatched it in `X-HarnessRL-Parent-Call`.
MATPO details: a worker's first user message recaps the user's query before its sub-task,
and every worker ends with a summary turn whose text is what the planner receives.
"""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.client import HarnessRL
from harnessrl.harness_examples.chat import (
    EpisodeStopped,
    RolloutResult,
    chat,
    harnessrl_client,
    make_client,
    resolve_model,
    run_tool,
    tool_message,
)
from harnessrl.harness_examples.fictional_world import QA
from harnessrl.harness_examples.search_task import SEARCH_TOOL, SearchEnv, score
from harnessrl.harness_examples.text_metrics import extract_answer

PLANNER_SYSTEM = (
    "You are the planner. Answer the user's question by breaking it into simple sub-tasks and "
    "dispatching each one to the search agent with the search_agent tool; it searches a document "
    "collection and reports back. When you know the answer, reply with <answer>the answer</answer>."
)
WORKER_SYSTEM = (
    "You are a search agent working for a planner. Use the search tool to find the facts your "
    "sub-task asks for. Search again with new keywords when a result names a new entity."
)
SUMMARY_PROMPT = (
    "Summarize for the planner what you found for your sub-task in one or two sentences, "
    "naming the answer if you found it."
)
DISPATCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_agent",
        "description": "Dispatch a search agent with a sub-task; it returns a summary of what it found.",
        "parameters": {
            "type": "object",
            "properties": {"task": {"type": "string", "description": "The sub-task for the search agent."}},
            "required": ["task"],
        },
    },
}


@dataclass
class PlannerWorkerConfig:
    model: str | None = None  # None: the model the proxy serves
    max_planner_turns: int = 4
    max_worker_turns: int = 3
    max_tokens: int = 256
    temperature: float = 1.0
    reward: str = "f1"  # the outcome reported: f1 | em
    # If the planner's first reply dispatches no search agent, the harness dispatches one itself
    # with the user's question and hands the report to the planner as a user message.
    always_dispatch_first: bool = False


class _Episode:
    def __init__(self, ro, env: SearchEnv, task: QA, cfg: PlannerWorkerConfig) -> None:
        self.ro, self.env, self.task, self.cfg = ro, env, task, cfg
        self.workers = 0
        self.model = cfg.model
        self.counts = {"model_calls": 0, "tool_calls": 0, "tool_errors": 0}

    def _chat(self, client, messages, tools):
        self.counts["model_calls"] += 1
        return chat(client, self.model, messages, tools, max_tokens=self.cfg.max_tokens,
                    temperature=self.cfg.temperature)

    def _count(self, ok: bool) -> None:
        self.counts["tool_calls"] += 1
        self.counts["tool_errors"] += not ok

    def worker(self, sub_task: str, parent_call: str | None) -> str:
        self.workers += 1
        headers = {"X-HarnessRL-Session": f"worker-{self.workers}"}
        if parent_call:
            headers["X-HarnessRL-Parent-Call"] = parent_call
        client = make_client(self.ro.base_url("worker"), self.ro.api_key("worker"), headers)
        messages = [
            {"role": "system", "content": WORKER_SYSTEM},
            {"role": "user", "content": f"User query recap: {self.task.question}\n\nYour sub-task: {sub_task}"},
        ]
        tools = {"search": self.env.search}
        try:
            for _ in range(self.cfg.max_worker_turns):
                turn = self._chat(client, messages, [SEARCH_TOOL])
                messages.append(turn.message)
                if not turn.tool_calls:
                    break
                for call in turn.tool_calls:
                    result, ok = run_tool(call, tools)
                    self._count(ok)
                    messages.append(tool_message(call, result))
            # The summary turn keeps the tool list so its prompt extends the worker's context exactly.
            messages.append({"role": "user", "content": SUMMARY_PROMPT})
            summary = extract_answer(self._chat(client, messages, [SEARCH_TOOL]).content)
        finally:
            client.close()
        return summary or "The search agent found nothing."

    def run(self) -> str:
        client = make_client(self.ro.base_url("planner"), self.ro.api_key("planner"),
                             {"X-HarnessRL-Session": "planner"})
        messages = [{"role": "system", "content": PLANNER_SYSTEM}, {"role": "user", "content": self.task.question}]
        try:
            self.model = resolve_model(client, self.cfg.model)
            for turn_no in range(self.cfg.max_planner_turns):
                turn = self._chat(client, messages, [DISPATCH_TOOL])
                messages.append(turn.message)
                oks = []
                for call in turn.tool_calls:
                    if call.error is None and call.name == "search_agent" and not isinstance(call.arguments.get("task"), str):
                        result, ok = "Error: search_agent needs a string argument 'task'.", False
                    else:
                        result, ok = run_tool(call, {"search_agent": lambda task: self.worker(task, turn.call_id)})
                    self._count(ok)
                    oks.append(ok)
                    messages.append(tool_message(call, result))
                if oks and turn.call_id:
                    self.ro.process_reward(turn.call_id, sum(oks) / len(oks), name="dispatch_ok")
                if turn_no == 0 and self.cfg.always_dispatch_first and self.workers == 0:
                    report = self.worker(self.task.question, turn.call_id)
                    messages.append({"role": "user", "content": f"The search agent reports: {report}\n"
                                     "Answer with <answer>the answer</answer>."})
                    continue
                if not turn.tool_calls:
                    return extract_answer(turn.content)
            return ""
        finally:
            client.close()


def run_rollout(hrl: HarnessRL | str, env: SearchEnv, task: QA, cfg: PlannerWorkerConfig | None = None, *,
                group_id: str | None = None, run: str | None = None) -> RolloutResult:
    """One planner–worker episode on `task` through the proxy; reports the outcome reward."""
    cfg = cfg or PlannerWorkerConfig()
    with harnessrl_client(hrl) as hrl_client, hrl_client.rollout(
            task_id=task.id, group_id=group_id or task.id, run=run, metadata={"harness": "planner_worker"}) as ro:
        episode = _Episode(ro, env, task, cfg)
        error = None
        try:
            answer = episode.run()
        except EpisodeStopped as exc:
            answer, error = "", str(exc)
        scores = score(answer, task)
        outcome = scores[cfg.reward]
        ro.reward(outcome)
        metrics = {**scores, "success": scores["em"], "workers": episode.workers, **episode.counts}
        return RolloutResult(ro.id, task.id, outcome, answer, metrics, error)
