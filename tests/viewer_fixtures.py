"""Records for the viewer tests: rollouts recorded through the real proxy (tiny model, openai SDK
on a real socket) — a planner dispatching a worker session, a retried turn whose prompts and tool
results carry HTML and script payloads, a rollout left running — plus one call inserted through
the ORM whose completion ids are a known text (think / tool call / args), so token classes and an
escaped completion can be asserted exactly; then a real compile for `--samples`; and the viewer
served by uvicorn on a real socket."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
from asgi_thread import serve_in_thread

from harnessrl.client import HarnessRL
from harnessrl.db import open_db
from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import TEXT_ONLY, Call, Reward, Rollout, pack_ids, pack_logprobs

SCRIPT = "<script>document.title='pwned'</script>"
ONERROR = "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
TAGS = "<b>bold</b><a href='https://example.com'>link</a>"
PAYLOAD = f"{SCRIPT} {ONERROR} {TAGS}"
CRAFTED = ('<think>plan <b>first</b></think>\n<tool_call>\n{"name": "lookup", "arguments": {"query": "'
           + SCRIPT.replace('"', "'") + '"}}\n</tool_call><|im_end|>')
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look something up.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]


HARNESS = "fixture-harness/1.0 <b>ua</b>"  # a User-Agent with markup: shown as text


def chat(ro, agent, messages, session=None, parent=None, tools=None) -> tuple[str, dict]:
    client = openai.OpenAI(base_url=ro.base_url(agent), api_key="unused", max_retries=0)
    headers = {k: v for k, v in (("X-HarnessRL-Session", session), ("X-HarnessRL-Parent-Call", parent)) if v}
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0, seed=1, extra_headers=headers,
        **({"tools": tools} if tools else {}))
    return raw.headers["x-harnessrl-call"], raw.parse().choices[0].message.model_dump(exclude_none=True)


def record_through_proxy(url: str) -> dict[str, str]:
    """The proxy-recorded rollouts; returns {name: rollout id or call id}."""
    hrl, ids = HarnessRL(url), {}
    with hrl.rollout(task_id="t1", group_id="g1", run="round-0") as ro:
        ids["planner"] = ro.id
        m = [{"role": "system", "content": "Plan."}, {"role": "user", "content": "Capital of France?"}]
        ids["p0"], reply = chat(ro, "planner", m, tools=TOOLS)
        ids["w0"], _ = chat(ro, "worker", [{"role": "user", "content": "Find the capital."}], session="s1",
                            parent=ids["p0"])
        ids["p1"], _ = chat(ro, "planner", m + [reply, {"role": "user", "content": "Worker says: Paris."}],
                            tools=TOOLS)
        ro.process_reward(ids["p0"], 0.5, name="<i>fmt</i>")
        ro.reward(1.0)
    with hrl.rollout(task_id="t1", group_id="g1", run="round-0") as ro:
        ids["retry"] = ro.id
        m = [{"role": "user", "content": f"Summarise this page: {PAYLOAD}"}]
        ids["r0"], reply = chat(ro, "solo", m)
        m = m + [reply, {"role": "tool", "tool_call_id": "x1", "content": f"tool result {PAYLOAD}"}]
        ids["r1"], _ = chat(ro, "solo", m)
        ids["r2"], _ = chat(ro, "solo", m)  # the same turn again: a branch of the tree
        ro.reward(0.0)
    running = hrl.create_rollout(task_id="t2", group_id="g2", run="round-1")  # left running
    ids["running"] = running.id
    ids["q0"], _ = chat(running, "solo", [{"role": "user", "content": "Still going."}])
    refused = httpx.post(running.base_url("solo") + "/chat/completions", json={"model": "tiny", "messages": [
        {"role": "user", "content": "Still going."}], "max_tokens": -1}, headers={"User-Agent": HARNESS})
    assert refused.status_code == 400  # refused before it ran, and recorded as an error call
    ids["refused"] = refused.headers["x-harnessrl-call"]
    # refused on other surfaces, before translation: recorded with the body as it came
    for name, path, body in (
            ("refused_messages", "/messages", {"model": "tiny", "max_tokens": "lots", "messages": [
                {"role": "user", "content": [{"type": "text", "text": f"hi {SCRIPT}"}]}]}),
            ("refused_responses", "/responses", {"model": "tiny", "input": [{"role": "user", "content": "hello"}],
                                                 "max_output_tokens": -3})):
        refused = httpx.post(running.base_url("cc") + path, json=body, headers={"User-Agent": HARNESS})
        assert refused.status_code == 400, refused.text
        ids[name] = refused.headers["x-harnessrl-call"]
    running.reward(0.25)
    hrl.close()
    return ids


def insert_crafted(db: str, model_dir: Path) -> str:
    """A finished rollout whose one call completes with CRAFTED (ids from the tiny tokenizer)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prompt = tok.encode("<|im_start|>user\nLook it up.<|im_end|>\n<|im_start|>assistant\n").ids
    completion = tok.encode(CRAFTED).ids
    engine, make = open_db(db)
    with make.begin() as s:
        s.add(Rollout(id="crafted", task_id="t2", group_id="g2", run="round-1", status="finished", next_seq=1,
                      created_at=time.time(), finished_at=time.time() + 2.5))
        s.flush()
        s.add(Call(id="crafted-c0", rollout_id="crafted", seq=0, agent="solo", endpoint="chat", model=str(model_dir),
                   request={"messages": [{"role": "user", "content": "Look it up."}]}, response_text=CRAFTED,
                   status="ok", prompt_ids=pack_ids(prompt), completion_ids=pack_ids(completion),
                   completion_logprobs=pack_logprobs([-0.05 * k for k in range(len(completion))]),
                   prompt_path="render", weight_version="v0", prompt_tokens=len(prompt),
                   completion_tokens=len(completion), latency_ms=12.0, created_at=time.time()))
        s.add(Reward(rollout_id="crafted", kind="outcome", name="outcome", value=1.0, created_at=time.time()))
    engine.dispose()
    return "crafted"


LONG_TOOLS = [
    {"type": "function", "function": {"name": "Bash", "description": "Run a shell command in the workspace.",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                     "required": ["command"]}}},
    {"type": "function", "function": {"name": "Read", "description": f"Read a file of the workspace. {ONERROR}",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}}]
RATE_LIMITED = "429 rate_limit_error: upstream says slow down"


def insert_long_session(db: str, rollout_id: str = "long", turns: int = 100, token_ids: bool = True) -> dict[str, Any]:
    """A coding agent's session as a CLI harness records it: agent `claude` runs `turns` tool
    turns (each prompt = the previous prompt + its reply + a tool result); turn 40 is first
    refused upstream (an error call) and retried; a `haiku` agent makes a title call before the
    loop and another in the middle; turn 10 dispatches a 3-call `explore` sub-agent (session
    `sub1`). `token_ids=False`: the same session through a text-only upstream (no token ids).
    Returns the call ids by role."""
    engine, make = open_db(db)
    now = time.time()
    seq = itertools.count()
    rows: list[Call] = []
    out: dict[str, Any] = {"rollout": rollout_id, "main": [], "haiku": [], "explore": []}

    def add(agent, messages, prompt, completion, tool_calls=None, text=None, status="ok", error=None,
            session=None, parent=None) -> str:
        i = next(seq)
        ok, ids = status == "ok", token_ids and status == "ok"
        rows.append(Call(id=f"{rollout_id}-c{i:03d}", rollout_id=rollout_id, seq=i, agent=agent, session_id=session,
                         parent_call_id=parent, endpoint="chat", model="claude-sonnet", stream=True,
                         request={"messages": messages, "tools": LONG_TOOLS}, response_text=text if ok else None,
                         tool_calls=tool_calls if ok else None, status=status, error=error,
                         prompt_ids=pack_ids(prompt) if ids else None,
                         completion_ids=pack_ids(completion) if ids else None,
                         prompt_path=("prefix" if ids else TEXT_ONLY) if ok else None, prompt_tokens=len(prompt),
                         completion_tokens=len(completion) if ok else None, latency_ms=100.0 + i, created_at=now + i))
        return rows[-1].id

    out["haiku"].append(add("haiku", [{"role": "user", "content": "Title for: fix the failing tests"}], [5, 6],
                            [7], text="Fix failing tests"))
    messages = [{"role": "system", "content": "You are a coding agent. " * 40},
                {"role": "user", "content": "Fix the failing tests."}]

    def billed(messages: list[dict], t: int) -> list[dict]:
        """As Claude Code sends them: the system prompt opens with a hash that changes per call."""
        return [{"role": "system", "content": f"x-anthropic-billing-header: cch={t:05x};\n{messages[0]['content']}"},
                *messages[1:]]

    prompt = [1, 2, 3, 4]
    for t in range(turns):
        completion = [100 + t % 50, 101, 102]
        last = t == turns - 1
        call = {"id": f"tc{t}", "type": "function", "function": {"name": "Bash", "arguments": json.dumps(
            {"command": f"pytest -k case{t}"})}}
        if t == 40:
            out["error"] = add("claude", billed(messages, 999), prompt, [], status="error", error=RATE_LIMITED)
        cid = add("claude", billed(messages, t), prompt, completion, None if last else [call],
                  "Done: all tests pass." if last else None)
        out["main"].append(cid)
        if t == 10:
            sub = [{"role": "user", "content": "Explore the test layout."}]
            sub_prompt = [900, 901]
            for k in range(3):
                out["explore"].append(add("explore", list(sub), sub_prompt, [910 + k], text=f"found {k}",
                                          session="sub1", parent=cid))
                sub += [{"role": "assistant", "content": f"found {k}"}, {"role": "user", "content": "more"}]
                sub_prompt = sub_prompt + [910 + k, 920]
        if t == 60:
            out["haiku"].append(add("haiku", [{"role": "user", "content": "Summarise progress"}], [8], [9],
                                    text="Halfway"))
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"tc{t}", "content": f"case{t}: 1 passed\n" + "ok\n" * 3}]
        prompt = prompt + completion + [200 + t % 50, 201]
    with make.begin() as s:
        s.add(Rollout(id=rollout_id, task_id="long", run="cli", status="finished", next_seq=next(seq),
                      created_at=now, finished_at=now + 200))
        s.flush()
        s.add_all(rows)
    engine.dispose()
    return out


def record_all(db: str, model_dir: Path) -> dict[str, str]:
    backend = LocalBackend(model_dir, seed=0)
    try:
        with run_proxy(ProxyConfig(db=db, backend="local", model=str(model_dir), port=0), backend=backend) as proxy:
            ids = record_through_proxy(proxy.url)
    finally:
        backend.close()
    ids["crafted"] = insert_crafted(db, model_dir)
    return ids


def compile_samples(db: str, out: Path) -> Path:
    from harnessrl.compiler.pipeline import CompileOptions, Compiler

    Compiler(db, CompileOptions(out=out, train_agents="all")).run()
    return out


def serve(app):
    """The app on a real socket (a free port) for the duration of the block; yields its URL."""
    return serve_in_thread(app, lifespan="off")
