"""The toolbox harness: one agent with the four attribute tools, or (delegated tasks) a planner
whose `ask_worker` tool runs a worker agent — a session of its own, naming the planner call
that dispatched it — with those tools."""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.client import HarnessRL
from harnessrl.harness_examples.chat import RolloutResult, harnessrl_client, make_client, tool_loop
from harnessrl.harness_examples.toolbox.tasks import ATTRIBUTES, ToolboxTask
from harnessrl.answer_match import exact_match


@dataclass
class ToolboxConfig:
    model: str = "default"
    max_turns: int = 3
    max_tokens: int = 40
    temperature: float = 1.0


def _tools(table: dict[tuple[str, str], str], tried: list[tuple[str, str]]) -> dict:
    """The attribute tools over `table`; each call appends its (item, attribute) to `tried`, so
    the answer's source is known (the calls that ran are those whose pair is in `table`)."""
    def getter(attribute: str):
        def get(item: str) -> str:
            tried.append((item, attribute))
            if (item, attribute) not in table:
                raise ValueError(f"no item {item!r}")
            return table[(item, attribute)]
        return get

    return {f"get_{a}": getter(a) for a in ATTRIBUTES}


def run_rollout(hrl: HarnessRL | str, table: dict[tuple[str, str], str], task: ToolboxTask,
                cfg: ToolboxConfig | None = None, *, group_id: str | None = None,
                run: str | None = None) -> RolloutResult:
    cfg = cfg or ToolboxConfig()
    # The first tool call that runs ends an agent's episode with its result as the answer, so the
    # reward is for the right tool with the right item (what the benchmark compares the
    # algorithms on), not for copying the result into a final reply.
    loop = dict(max_turns=cfg.max_turns, max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                answer_from_tool=True)
    with harnessrl_client(hrl) as hrl_client, hrl_client.rollout(
            task_id=task.id, group_id=group_id or task.id, run=run, metadata={"harness": "toolbox"}) as ro:
        counts = {"tool_calls": 0, "tool_errors": 0, "worker_calls": 0}
        tried: list[tuple[str, str]] = []  # (item, attribute) of every attribute tool call made
        if not task.delegate:
            with make_client(ro.base_url("agent"), ro.api_key("agent")) as client:
                answer, error, c = tool_loop(client, cfg.model, task.messages(), task.tools, _tools(table, tried),
                                             **loop)
            counts.update(c)
        else:
            def ask_worker(question: str) -> str:
                counts["worker_calls"] += 1
                messages = [task.worker_messages()[0], {"role": "user", "content": question}]
                with make_client(ro.base_url("worker"), ro.api_key("worker"),
                                 {"X-HarnessRL-Session": f"worker-{counts['worker_calls']}"}) as worker:
                    reply, _, c = tool_loop(worker, cfg.model, messages, task.worker_tools, _tools(table, tried),
                                            **loop)
                counts["tool_calls"] += c["tool_calls"]
                counts["tool_errors"] += c["tool_errors"]
                if not reply:
                    # a failed ask, not an answer: the planner's episode goes on and it may ask again
                    raise ValueError("the worker found no answer")
                return reply

            with make_client(ro.base_url("planner"), ro.api_key("planner"), {"X-HarnessRL-Session": "planner"}) as client:
                answer, error, c = tool_loop(client, cfg.model, task.messages(), task.tools,
                                             {"ask_worker": ask_worker}, **loop)
            counts["tool_calls"] += c["tool_calls"]
            counts["tool_errors"] += c["tool_errors"]
            counts["model_calls"] = c["model_calls"]
        em = exact_match(answer, [table[(task.item, task.attribute)]])
        # Success is the right tool called with the right item, the call whose result is the
        # answer (the last that ran: the first one ends the episode). The value alone is not
        # enough: there are 6 values per attribute, so a wrong item would share it ~1 time in 6.
        answered = [pair for pair in tried if pair in table]  # the calls that ran
        success = float(em == 1.0 and bool(answered) and answered[-1] == (task.item, task.attribute))
        ro.reward(success)
        # The two skills apart (action: which tool; args: which item), from the first attribute call
        first = tried[0] if tried else None
        parts = {"right_tool": float(first is not None and first[1] == task.attribute),
                 "right_item": float(first is not None and first[0] == task.item)}
        return RolloutResult(ro.id, task.id, success, answer, {"em": em, "success": success, **parts, **counts}, error)
