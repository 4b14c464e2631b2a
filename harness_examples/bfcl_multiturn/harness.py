"""The BFCL multi-turn agent: user turns arrive one by one; within a turn the model calls
tools (run locally on the task's back-end instances) until it replies without a call or hits
the step limit. After each turn whose ground truth is non-empty, BFCL's check runs: the turn
must have made a call, and every back-end's state must equal the state after the ground-truth
calls up to that turn. The outcome is 1.0 when every checked turn passes, else 0.0."""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.client import HarnessRL
from harnessrl.harness_examples.bfcl_multiturn.data import Backends, BfclTask, function_docs, openai_tools, parse_call, state_check
from harnessrl.harness_examples.chat import (
    EpisodeStopped,
    RolloutResult,
    ToolCall,
    chat,
    harnessrl_client,
    make_client,
    resolve_model,
    tool_message,
)

SYSTEM = "You are an assistant that completes the user's requests by calling the provided functions."


@dataclass
class BfclConfig:
    model: str | None = None  # None: the model the proxy serves
    max_steps_per_turn: int = 5  # BFCL itself allows 20; a step is one model call
    max_tokens: int = 256
    temperature: float = 1.0
    max_observation_chars: int = 2000  # long-context back-ends return very long results


def _execute(backends: Backends, call: ToolCall, allowed: set[str]) -> tuple[str, bool]:
    if call.error:
        return f"Error: {call.error}.", False
    if call.name not in allowed:
        return f"Error: unknown function {call.name!r}.", False
    return backends.call(call.name, kwargs=call.arguments)


def run_rollout(hrl: HarnessRL | str, task: BfclTask, cfg: BfclConfig | None = None, *,
                group_id: str | None = None, run: str | None = None) -> RolloutResult:
    cfg = cfg or BfclConfig()
    agent, truth = Backends(task), Backends(task)
    counts = {"model_calls": 0, "tool_calls": 0, "tool_errors": 0}
    turns_checked = turns_passed = 0
    error = None
    with harnessrl_client(hrl) as hrl_client, hrl_client.rollout(
            task_id=task.id, group_id=group_id or task.id, run=run, metadata={"harness": "bfcl_multiturn"}) as ro:
        client = make_client(ro.base_url("agent"), ro.api_key("agent"))
        messages: list[dict] = [{"role": "system", "content": SYSTEM}]
        try:
            model = resolve_model(client, cfg.model)
            for turn, gt_calls in enumerate(task.ground_truth):
                docs = function_docs(task, turn)
                tools, allowed = openai_tools(docs), {d["name"] for d in docs}
                messages += task.user_messages(turn)
                made_call = False
                for _ in range(cfg.max_steps_per_turn):
                    counts["model_calls"] += 1
                    reply = chat(client, model, messages, tools, max_tokens=cfg.max_tokens,
                                 temperature=cfg.temperature)
                    messages.append(reply.message)
                    if not reply.tool_calls:
                        break
                    oks = []
                    for call in reply.tool_calls:
                        result, ok = _execute(agent, call, allowed)
                        made_call |= call.error is None  # BFCL: the turn produced a decodable call
                        oks.append(ok)
                        messages.append(tool_message(call, result[: cfg.max_observation_chars]))
                    counts["tool_calls"] += len(oks)
                    counts["tool_errors"] += oks.count(False)
                    if reply.call_id:
                        ro.process_reward(reply.call_id, sum(oks) / len(oks), name="tool_ok")
                for text in gt_calls:
                    truth.call(*parse_call(text))
                if gt_calls:
                    turns_checked += 1
                    turns_passed += made_call and state_check(agent, truth)[0]
        except EpisodeStopped as exc:
            error = str(exc)
        finally:
            client.close()
        outcome = 1.0 if error is None and turns_passed == turns_checked else 0.0
        ro.reward(outcome)
        metrics = {"success": outcome, "turns_checked": turns_checked, "turns_passed": turns_passed, **counts}
        return RolloutResult(ro.id, task.id, outcome, "", metrics, error)
