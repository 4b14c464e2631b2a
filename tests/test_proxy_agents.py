"""Agents told apart without identity (docs/methods.md §2): a call that names neither agent nor
session is given the agent `<model>@<fingerprint of its system prompt>`, volatile spans masked —
Claude Code's main loop, its title side call and a Task sub-agent; an Agents SDK triage agent and
the worker it hands off to. Explicit identity always wins. Real SDK clients over a real socket, the
local tiny model, SQLite, then compile."""

from __future__ import annotations

import asyncio

import anthropic
import httpx
import openai
import pytest

from harnessrl.client import HarnessRL
from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.tiny_model import DEFAULT_TOOL
from surface_fixtures import Target, assert_extends, calls, compile_rollouts

TOOLS = [{"name": "lookup", "description": "Look a word up.",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}]
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.{v}; cc_entrypoint=sdk-cli; cch={h};{extra}"
MAIN = "You are an interactive agent that helps users with software engineering tasks."
TITLE = "Generate a concise, sentence-case title (3-7 words) that captures the main topic or goal of this session."
SUB = "You are an agent for Claude Code. Given the user's message, use the tools available to complete the task."


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    b = LocalBackend(tiny_model_dir, seed=0)
    yield b
    b.close()


def _system(v: str, h: str, text: str, extra: str = "") -> list[dict]:
    return [{"type": "text", "text": BILLING.format(v=v, h=h, extra=extra)}, {"type": "text", "text": text}]


def _claude_code(url: str, rollout: str) -> dict[str, list[str]]:
    """Claude Code's pattern of calls in one rollout, no agent named: a title call (haiku), the main
    loop (fresh cch= every call), a Task sub-agent in the middle of it. The call ids of each."""
    c = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0,
                            default_headers={"x-harnessrl-rollout": rollout})
    ids: dict[str, list[str]] = {"title": [], "main": [], "sub": []}

    def call(kind: str, model: str, system: list[dict], messages: list[dict], tools=TOOLS):
        raw = c.messages.with_raw_response.create(model=model, max_tokens=40, system=system, messages=messages,
                                                  extra_body={"temperature": 0}, **({"tools": tools} if tools else {}))
        ids[kind].append(raw.headers["x-harnessrl-call"])
        m = raw.parse()
        return {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]}, m

    task = [{"role": "user", "content": "Search for the capital of spain, then answer."}]
    call("title", "claude-haiku-4-5", _system("d11", "d63b9", TITLE), task, tools=None)
    main = list(task)
    for turn, h in enumerate(("5ae77", "f2a00", "78d0f")):
        reply, m = call("main", "claude-opus-4-8", _system("c40", h, MAIN), main)
        if turn == 1:  # the main loop dispatches a sub-agent; its calls come before the next main call
            sub = [{"role": "user", "content": "Find where the capital is defined."}]
            call("sub", "claude-opus-4-8", _system("a07", "1b2c3", SUB, " cc_is_subagent=true;"), sub)
        uses = [b for b in m.content if b.type == "tool_use"]
        main += [reply, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "madrid"}
                                                     for b in uses] or "Go on."}]
    return ids


def test_claude_code_main_loop_title_and_sub_agent_are_three_agents(backend, tiny_model_dir, tmp_path):
    names = []
    for run in ("a", "b"):  # the same harness twice, on two proxies: the names are the same
        db = str(tmp_path / f"{run}.db")
        with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0),
                       backend=backend) as proxy:
            ids = _claude_code(proxy.url, "cc")
        rows = {r.id: r for r in calls(db, "cc")}
        agents = {kind: {rows[i].agent for i in got} for kind, got in ids.items()}
        assert all(len(a) == 1 for a in agents.values()), agents  # every call of one agent, one name
        names.append({kind: a.pop() for kind, a in agents.items()})
    first = names[0]
    assert names[1] == first and len(set(first.values())) == 3
    assert first["title"].startswith("claude-haiku-4-5@") and first["main"].startswith("claude-opus-4-8@")
    assert first["sub"].startswith("claude-opus-4-8@") and len(first["main"]) == len("claude-opus-4-8@") + 4
    # the main loop extends itself across the sub-agent's call; compile gives one sample per agent
    main = [rows[i] for i in ids["main"]]
    for earlier, later in zip(main, main[1:]):
        assert_extends(earlier, later)
    totals = compile_rollouts(Target("local", "", db, str(tiny_model_dir)), ("cc",), tmp_path / "out")
    assert (totals["sessions"], totals["samples"], totals["merges"]) == (3, 3, 2)


def test_explicit_identity_wins(backend, tiny_model_dir, tmp_path):
    db = str(tmp_path / "r.db")
    body = {"model": "tiny", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0), backend=backend) as proxy:
        for path, headers in (("/r/ro/a/planner/v1/chat/completions", {}),
                              ("/v1/chat/completions", {"x-harnessrl-rollout": "ro", "x-harnessrl-agent": "worker"}),
                              ("/v1/chat/completions", {"x-harnessrl-rollout": "ro", "x-harnessrl-session": "s1"}),
                              ("/v1/chat/completions", {"x-harnessrl-rollout": "ro"})):
            assert httpx.post(proxy.url + path, json=body, headers=headers, timeout=60).status_code == 200
    assert [(r.agent, r.session_id) for r in calls(db, "ro")] == [
        ("planner", None), ("worker", None), (None, "s1"), (f"tiny@{_fp('Be brief.')}", None)]


def _fp(system: str) -> str:
    from harnessrl.proxy.prefix.volatile import Volatile

    return Volatile().fingerprint(system)


def test_agents_sdk_triage_and_worker_differ_by_instructions(backend, tiny_model_dir, tmp_path):
    from agents import Agent, ModelSettings, Runner, handoff, set_default_openai_client, set_tracing_disabled

    db = str(tmp_path / "r.db")
    settings = ModelSettings(temperature=0, max_tokens=60)
    worker = Agent(name="worker", instructions="You answer questions about capitals.", model="tiny",
                   model_settings=settings)
    # the handoff under the name the tiny model is imprinted to call
    triage = Agent(name="triage", instructions="You route each question to the right agent.", model="tiny",
                   model_settings=settings, handoffs=[handoff(worker, tool_name_override=DEFAULT_TOOL)])
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0), backend=backend) as proxy:
        hrl = HarnessRL(proxy.url)
        with hrl.rollout() as ro:
            set_tracing_disabled(True)
            set_default_openai_client(openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0,
                                                         default_headers={"x-harnessrl-rollout": ro.id}),
                                      use_for_tracing=False)
            result = asyncio.run(Runner.run(triage, "What is the capital of france?", max_turns=4))
    assert result.last_agent is worker
    rows = calls(db, ro.id)
    by_agent = [r.agent for r in rows]
    assert by_agent[0] == f"tiny@{_fp(triage.instructions)}" and by_agent[-1] == f"tiny@{_fp(worker.instructions)}"
    assert set(by_agent) == {by_agent[0], by_agent[-1]}


def test_compile_trains_the_main_loop_when_the_title_call_came_first(backend, tiny_model_dir, tmp_path):
    """Claude Code's title call is the rollout's first call; with the agents named by the proxy,
    compile's default central agent is the main loop (the most calls), not the title side call."""
    import pyarrow.parquet as pq

    from harnessrl.compiler.pipeline import CompileOptions, Compiler

    db = str(tmp_path / "r.db")
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0), backend=backend) as proxy:
        ids = _claude_code(proxy.url, "cc")
    rows = {r.id: r for r in calls(db, "cc")}
    assert min(rows.values(), key=lambda r: r.seq).id == ids["title"][0]  # the title call came first
    main_agent = rows[ids["main"][0]].agent
    out = tmp_path / "out"
    Compiler(db, CompileOptions(out=out, rollouts=("cc",), tokenizer=str(tiny_model_dir),
                                missing_outcome="zero")).run()
    samples = pq.read_table(out / "samples.parquet").to_pydict()
    trained = {a for a, mask in zip(samples["agent"], samples["loss_mask"]) if any(mask)}
    assert trained == {main_agent}
