"""The assistant harness: one agent, the nine tools, one reply. Its first tool call is the
episode: the right tool with the right name or place scores 1, anything else 0 (a reply in prose
included: the question asks for a tool)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harnessrl.client import HarnessRL
from harnessrl.harness_examples.assistant.tasks import TOOLS, TOOLS_SPEC, AssistantTask, result
from harnessrl.harness_examples.chat import RolloutResult, harnessrl_client, make_client, tool_loop


@dataclass
class AssistantConfig:
    model: str = "default"
    max_tokens: int = 48  # a call of one argument is about 25 tokens
    temperature: float = 1.0


def run_rollout(hrl: HarnessRL | str, task: AssistantTask, cfg: AssistantConfig | None = None, *,
                group_id: str | None = None, run: str | None = None) -> RolloutResult:
    cfg = cfg or AssistantConfig()
    calls: list[tuple[str, dict[str, Any]]] = []

    def tool(name: str):
        def call(**args: Any) -> str:
            calls.append((name, args))
            value = next(iter(args.values()), "") if len(args) == 1 else ""
            return result(name, str(value))
        return call

    with harnessrl_client(hrl) as hrl_client, hrl_client.rollout(
            task_id=task.id, group_id=group_id or task.id, run=run, metadata={"harness": "assistant"}) as ro:
        with make_client(ro.base_url("agent"), ro.api_key("agent")) as client:
            answer, error, counts = tool_loop(client, cfg.model, task.messages(), TOOLS,
                                              {name: tool(name) for name in TOOLS_SPEC}, max_turns=1,
                                              max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                                              answer_from_tool=True)
        right_tool, right_arg = task.right(*calls[0]) if calls else (False, False)
        success = float(right_tool and right_arg)
        ro.reward(success)
        parts = {"right_tool": float(right_tool), "right_item": float(right_arg), "called": float(bool(calls))}
        return RolloutResult(ro.id, task.id, success, answer, {"success": success, **parts, **counts}, error)
