"""The lookup harness: one agent, the `lookup` tool, answer with <answer>value</answer>."""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.client import HarnessRL
from harnessrl.harness_examples.chat import (
    EpisodeStopped,
    RolloutResult,
    chat,
    harnessrl_client,
    make_client,
    run_tool,
    tool_message,
)
from harnessrl.harness_examples.lookup.tasks import LOOKUP_TOOL, LookupTask
from harnessrl.harness_examples.text_metrics import exact_match, extract_answer


@dataclass
class LookupConfig:
    model: str = "default"
    max_turns: int = 3
    max_tokens: int = 48
    temperature: float = 1.0


def run_rollout(hrl: HarnessRL | str, table: dict[str, str], task: LookupTask, cfg: LookupConfig | None = None, *,
                group_id: str | None = None, run: str | None = None) -> RolloutResult:
    cfg = cfg or LookupConfig()

    def lookup(query: str) -> str:
        if query not in table:
            raise ValueError(f"no value stored under key {query!r}")
        return table[query]

    counts = {"model_calls": 0, "tool_calls": 0, "tool_errors": 0}
    with harnessrl_client(hrl) as hrl_client, hrl_client.rollout(
            task_id=task.id, group_id=group_id or task.id, run=run, metadata={"harness": "lookup"}) as ro:
        client = make_client(ro.base_url("agent"), f"hrl-{ro.id}-agent")
        messages = task.messages()
        answer, error = "", None
        try:
            for _ in range(cfg.max_turns):
                counts["model_calls"] += 1
                turn = chat(client, cfg.model, messages, [LOOKUP_TOOL], max_tokens=cfg.max_tokens,
                            temperature=cfg.temperature)
                messages.append(turn.message)
                if not turn.tool_calls:
                    answer = extract_answer(turn.content)
                    break
                for call in turn.tool_calls:
                    result, ok = run_tool(call, {"lookup": lookup})
                    counts["tool_calls"] += 1
                    counts["tool_errors"] += not ok
                    messages.append(tool_message(call, result))
        except EpisodeStopped as exc:
            error = str(exc)
        finally:
            client.close()
        em = exact_match(answer, [task.value])
        ro.reward(em)
        return RolloutResult(ro.id, task.id, em, answer, {"em": em, "success": em, **counts}, error)
