"""The lookup harness: one agent, the `lookup` tool, answer with <answer>value</answer>."""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.client import HarnessRL
from harnessrl.harness_examples.chat import RolloutResult, harnessrl_client, make_client, tool_loop
from harnessrl.harness_examples.lookup.tasks import LOOKUP_TOOL, LookupTask
from harnessrl.answer_match import exact_match


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

    with harnessrl_client(hrl) as hrl_client, hrl_client.rollout(
            task_id=task.id, group_id=group_id or task.id, run=run, metadata={"harness": "lookup"}) as ro:
        with make_client(ro.base_url("agent"), ro.api_key("agent")) as client:
            answer, error, counts = tool_loop(client, cfg.model, task.messages(), [LOOKUP_TOOL], {"lookup": lookup},
                                              max_turns=cfg.max_turns, max_tokens=cfg.max_tokens,
                                              temperature=cfg.temperature)
        em = exact_match(answer, [task.value])
        ro.reward(em)
        return RolloutResult(ro.id, task.id, em, answer, {"em": em, "success": em, **counts}, error)
