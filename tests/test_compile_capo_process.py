"""Issue 41: `compile --algo capo` (and `loop --algo capo`) compile the Harness-RL paper's rewards,
the outcome and the decision-level process rewards `tool_format` and `dispatch_ok`
(`harnessrl/algorithms.py`), into `A_{e,j} = Â_e + 0.1·Ã^proc_{e,j}` (docs/methods.md §5); `--process
none` gives the outcome alone, as before. Recorded through the real proxy (vLLM stand-in upstream,
openai SDK on a socket, SQLite file); the stand-in calls the request's first tool with
`{"key": <word>, "n": <int>}`, so the tool schema decides whether the call is valid."""

from __future__ import annotations

import json

import httpx
import openai
import pyarrow.parquet as pq
import pytest

from harnessrl.algorithms import get_algorithm, process_rewards
from test_compiler_pipeline import cli_in_process

MSG = [{"role": "user", "content": "Find the key."}]


def _tools(n_type: str) -> list[dict]:
    return [{"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"key": {"type": "string"}, "n": {"type": n_type}}, "required": ["key"]}}}]


def _rollout(proxy: str, rid: str, outcome: float, first_tools: list[dict], result: str) -> None:
    """Two decisions of agent "main": a call (valid or not by `first_tools`), its tool `result`,
    then a second call (valid; nothing follows it)."""
    api = f"{proxy}/harnessrl/rollouts"
    httpx.post(api, json={"id": rid, "task_id": "t", "group_id": "g"}).raise_for_status()
    client = openai.OpenAI(base_url=f"{proxy}/r/{rid}/a/main/v1", api_key="unused", max_retries=0)
    first = client.chat.completions.create(model="m", messages=MSG, tools=first_tools, max_tokens=300)
    reply = first.choices[0].message
    call = reply.tool_calls[0]
    history = [*MSG, {"role": "assistant", "content": reply.content, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                         "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": result}]
    client.chat.completions.create(model="m", messages=history, tools=_tools("integer"), max_tokens=300)
    httpx.post(f"{api}/{rid}/reward", json={"value": outcome}).raise_for_status()
    httpx.post(f"{api}/{rid}/finish").raise_for_status()


def _advantages(out) -> dict[str, list[float]]:
    """Per rollout, the advantage of each trained decision in call order (the first token of each
    run of trainable tokens: a decision's tokens share one advantage)."""
    got: dict[str, list[float]] = {}
    for s in pq.read_table(out / "samples.parquet").to_pylist():
        prev = 0
        for a, m in zip(s["advantage"], s["loss_mask"]):
            if m and not prev:
                got.setdefault(s["rollout_id"], []).append(round(a, 4))
            prev = m
    return got


def test_the_registry_names_each_papers_process_rewards():
    capo, grpo = get_algorithm("capo"), get_algorithm("grpo")
    assert process_rewards(capo, None) == ("tool_format", "dispatch_ok")
    assert process_rewards(grpo, None) == () and process_rewards(None, None) == ()
    assert process_rewards(capo, "none") == () and process_rewards(grpo, "dispatch_ok") == ("dispatch_ok",)


def test_compile_algo_capo_adds_the_process_term(upstream, tokenizer_dir, tmp_path, monkeypatch, capsys):
    db = str(tmp_path / "runs.db")
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        # good: a valid call (n an integer) answered without an error; bad: its n is not the
        # schema's type (a string), and the tool answered an error
        _rollout(proxy.url, "good", 1.0, _tools("integer"), "42")
        _rollout(proxy.url, "bad", 0.0, _tools("string"), "error: no such key")
    base = ["compile", db, "--tokenizer", str(tokenizer_dir), "--jobs", "1", "--algo", "capo"]
    code, out, err = cli_in_process(monkeypatch, capsys, *base, "--out", str(tmp_path / "capo"))
    assert code == 0, err
    options = json.loads((tmp_path / "capo" / "stats.json").read_text())["options"]
    assert options["process"] == ["tool_format", "dispatch_ok"] and options["advantage"] == "harness"
    # Â: outcomes (1, 0) → ±0.5/0.7071 = ±0.7071. Process (mean of tool_format, dispatch_ok) at
    # decision 0: good (1 + 1)/2 = 1, bad (0 + 0)/2 = 0 → Ã = ±0.7071; decision 1: both (1 + 1)/2
    # (valid, nothing followed) → equal → Ã = 0. A = Â + 0.1·Ã: ±(0.7071 + 0.0707) = ±0.7778, then ±0.7071
    assert _advantages(tmp_path / "capo") == {"good": [0.7778, 0.7071], "bad": [-0.7778, -0.7071]}
    code, out, err = cli_in_process(monkeypatch, capsys, *base, "--process", "none", "--out", str(tmp_path / "none"))
    assert code == 0, err
    assert _advantages(tmp_path / "none") == {"good": [0.7071, 0.7071], "bad": [-0.7071, -0.7071]}
