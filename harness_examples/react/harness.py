"""A single-agent ReAct loop: think, call `search` or `calculator`, read the observation,
repeat, and finish with `<answer>…</answer>`. One agent, one session: the GRPO baseline."""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.client import HarnessRL
from harnessrl.harness_examples.calculator import CALCULATOR_TOOL, calculator
from harnessrl.harness_examples.chat import RolloutResult, harnessrl_client, make_client, tool_loop
from harnessrl.harness_examples.fictional_world import QA
from harnessrl.harness_examples.search_task import SEARCH_TOOL, SearchEnv, score

SYSTEM = (
    "Answer the question. Think step by step, use the search tool to look up facts and the "
    "calculator for arithmetic, and finish with <answer>the answer</answer>."
)


@dataclass
class ReactConfig:
    model: str | None = None  # None: the model the proxy serves
    max_turns: int = 6
    max_tokens: int = 256
    temperature: float = 1.0
    reward: str = "f1"  # f1 | em


def run_rollout(hrl: HarnessRL | str, env: SearchEnv, task: QA, cfg: ReactConfig | None = None, *,
                group_id: str | None = None, run: str | None = None) -> RolloutResult:
    cfg = cfg or ReactConfig()
    tools = {"search": env.search, "calculator": calculator}
    with harnessrl_client(hrl) as hrl_client, hrl_client.rollout(
            task_id=task.id, group_id=group_id or task.id, run=run, metadata={"harness": "react"}) as ro:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.question}]
        with make_client(ro.base_url("agent"), ro.api_key("agent")) as client:
            answer, error, counts = tool_loop(client, cfg.model, messages, [SEARCH_TOOL, CALCULATOR_TOOL], tools,
                                              max_turns=cfg.max_turns, max_tokens=cfg.max_tokens,
                                              temperature=cfg.temperature)
        scores = score(answer, task)
        ro.reward(scores[cfg.reward])
        return RolloutResult(ro.id, task.id, scores[cfg.reward], answer,
                             {**scores, "success": scores["em"], **counts}, error)
