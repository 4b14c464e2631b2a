"""A single-agent ReAct loop: think, call `search` or `calculator`, read the observation,
repeat, and finish with `<answer>…</answer>`. One agent, one session: the GRPO baseline."""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.client import HarnessRL
from harnessrl.harness_examples.calculator import CALCULATOR_TOOL, calculator
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
    counts = {"model_calls": 0, "tool_calls": 0, "tool_errors": 0}
    with harnessrl_client(hrl) as hrl_client, hrl_client.rollout(
            task_id=task.id, group_id=group_id or task.id, run=run, metadata={"harness": "react"}) as ro:
        client = make_client(ro.base_url("agent"), f"hrl-{ro.id}-agent")
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.question}]
        answer, error = "", None
        try:
            model = resolve_model(client, cfg.model)
            for _ in range(cfg.max_turns):
                counts["model_calls"] += 1
                turn = chat(client, model, messages, [SEARCH_TOOL, CALCULATOR_TOOL],
                            max_tokens=cfg.max_tokens, temperature=cfg.temperature)
                messages.append(turn.message)
                if not turn.tool_calls:
                    answer = extract_answer(turn.content)
                    break
                for call in turn.tool_calls:
                    result, ok = run_tool(call, tools)
                    counts["tool_calls"] += 1
                    counts["tool_errors"] += not ok
                    messages.append(tool_message(call, result))
        except EpisodeStopped as exc:
            error = str(exc)
        finally:
            client.close()
        scores = score(answer, task)
        ro.reward(scores[cfg.reward])
        return RolloutResult(ro.id, task.id, scores[cfg.reward], answer,
                             {**scores, "success": scores["em"], **counts}, error)
