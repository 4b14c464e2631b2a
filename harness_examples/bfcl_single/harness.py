"""The BFCL single-turn agent: one model call with the entry's question and its functions as
tools, as BFCL runs a function-calling model on these categories; its tool calls are the answer,
and BFCL's AST checker is the outcome (1.0 valid, else 0.0). Nothing is executed."""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.client import HarnessRL
from harnessrl.harness_examples.bfcl_single.checker import check
from harnessrl.harness_examples.bfcl_single.data import BfclSingleTask, openai_tools
from harnessrl.harness_examples.chat import (
    EpisodeStopped,
    RolloutResult,
    chat,
    harnessrl_client,
    make_client,
    resolve_model,
)


@dataclass
class BfclSingleConfig:
    model: str | None = None  # None: the model the proxy serves
    max_tokens: int = 256  # parallel answers hold several calls
    temperature: float = 1.0


def run_rollout(hrl: HarnessRL | str, task: BfclSingleTask, cfg: BfclSingleConfig | None = None, *,
                group_id: str | None = None, run: str | None = None) -> RolloutResult:
    cfg = cfg or BfclSingleConfig()
    error, calls, verdict = None, [], {"valid": False, "error_type": "no reply"}
    with harnessrl_client(hrl) as hrl_client, hrl_client.rollout(
            task_id=task.id, group_id=group_id or task.id, run=run,
            metadata={"harness": "bfcl_single", "category": task.category}) as ro:
        with make_client(ro.base_url("agent"), ro.api_key("agent")) as client:
            try:
                reply = chat(client, resolve_model(client, cfg.model), list(task.messages), openai_tools(task),
                             max_tokens=cfg.max_tokens, temperature=cfg.temperature)
                calls = [(c.name, c.raw_arguments) for c in reply.tool_calls]
                verdict = check(task, calls)
            except EpisodeStopped as exc:
                error = str(exc)
        outcome = float(bool(verdict["valid"]))
        ro.reward(outcome)
        metrics = {"success": outcome, "model_calls": 1.0, "tool_calls": float(len(calls)),
                   "decoded": float(error is None and not verdict.get("error_type", "").startswith("ast_decoder"))}
        # the answer column: BFCL's verdict ("valid" or its error type)
        return RolloutResult(ro.id, task.id, outcome, "valid" if outcome else verdict.get("error_type", ""), metrics,
                             error)
