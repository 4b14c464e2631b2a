"""Records for the viewer tests: rollouts recorded through the real proxy (tiny model, openai SDK
on a real socket) — a planner dispatching a worker session, a retried turn whose prompts and tool
results carry HTML and script payloads, a rollout left running — plus one call inserted through
the ORM whose completion ids are a known text (think / tool call / args), so token classes and an
escaped completion can be asserted exactly; then a real compile for `--samples`; and the viewer
served by uvicorn on a real socket."""

from __future__ import annotations

import time
from pathlib import Path

import openai
from asgi_thread import serve_in_thread

from harnessrl.client import HarnessRL
from harnessrl.db import open_db
from harnessrl.proxy.local_backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, Reward, Rollout, pack_ids, pack_logprobs

SCRIPT = "<script>document.title='pwned'</script>"
ONERROR = "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
TAGS = "<b>bold</b><a href='https://example.com'>link</a>"
PAYLOAD = f"{SCRIPT} {ONERROR} {TAGS}"
CRAFTED = ('<think>plan <b>first</b></think>\n<tool_call>\n{"name": "lookup", "arguments": {"query": "'
           + SCRIPT.replace('"', "'") + '"}}\n</tool_call><|im_end|>')
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look something up.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]


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
    from harnessrl.compiler.export import CompileOptions, Compiler

    Compiler(db, CompileOptions(out=out, train_agents="all")).run()
    return out


def serve(app):
    """The app on a real socket (a free port) for the duration of the block; yields its URL."""
    return serve_in_thread(app, lifespan="off")
