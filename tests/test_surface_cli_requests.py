"""The request shapes real harness CLIs send (captured once from Claude Code 2.1.197, Codex 0.171
and OpenCode's Vercel AI SDK; trimmed copies in tests/cli_requests/), replayed through the
anthropic and openai SDKs against the proxy on a real socket, in front of the vLLM stand-in with
prefix-consistent prompts (so the prompt the model saw is in the records, as token ids): each is
served and recorded by its documented translation, or refused with a 400 naming what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from transformers import AutoTokenizer

from harnessrl.client import HarnessRL
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import unpack_ids
from surface_fixtures import assert_extends, assert_recorded, calls, serve_target

CAPTURED = Path(__file__).parent / "cli_requests"


def captured(name: str) -> dict:
    return json.loads((CAPTURED / name).read_text())


@pytest.fixture(scope="module")
def target(tiny_model_dir, upstream, tokenizer_dir, tmp_path_factory):
    with serve_target("standin", tmp_path_factory.mktemp("cli"), tiny_model_dir, upstream, tokenizer_dir) as t:
        yield t


@pytest.fixture(scope="module")
def strict(tmp_path_factory, upstream, tokenizer_dir):
    """A proxy run with --strict-tools."""
    db = str(tmp_path_factory.mktemp("strict") / "s.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0, strict_tools=True)) as proxy:
        yield proxy.url


def _prompt(target, row) -> str:
    return AutoTokenizer.from_pretrained(target.tokenizer).decode(unpack_ids(row.prompt_ids).tolist())


def _replay_messages(base_url: str, cap: dict):
    """The captured Messages call through the SDK's beta path (`POST /v1/messages?beta=true`, as
    Claude Code sends it), streamed; the events."""
    b = dict(cap["body"])
    c = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0)
    core = {k: b.pop(k) for k in ("model", "max_tokens", "messages")}
    b.pop("stream")
    betas = cap["headers"]["anthropic-beta"].split(",")
    return list(c.beta.messages.create(**core, stream=True, betas=betas, extra_body=b))


def test_claude_code_mid_conversation_system_message_is_rendered_in_place(target):
    cap = captured("claude_code_first_call.json")
    assert [m["role"] for m in cap["body"]["messages"]] == ["user", "system"]  # what 2.1.x sends
    with HarnessRL(target.url).rollout() as ro:
        events = _replay_messages(ro.base_url("cc").removesuffix("/v1"), cap)
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    (row,) = calls(target.db, ro.id)
    assert_recorded(row)
    assert [m["role"] for m in row.request["messages"]] == ["system", "user", "system"]
    assert row.request["messages"][2]["content"] == cap["body"]["messages"][1]["content"]
    assert "mid-conversation-system" in row.request["harnessrl_surface"]["headers"]["anthropic-beta"]
    # the template renders a later system message as a system turn where it stands
    prompt = _prompt(target, row)
    user_at = prompt.index("<|im_start|>user\n<system-reminder>")
    system_at = prompt.index("<|im_start|>system\nAvailable agent types")
    assert user_at < system_at and prompt.endswith("<|im_start|>assistant\n")
    assert len(row.request["tools"]) == len(cap["body"]["tools"]) == 25


def test_claude_code_tool_search_shows_a_deferred_tool_where_it_is_referenced(target):
    cap = captured("claude_code_tool_search.json")
    deferred = [t["name"] for t in cap["body"]["tools"] if t.get("defer_loading")]
    assert deferred == ["CronList"]
    with HarnessRL(target.url).rollout() as ro:
        _replay_messages(ro.base_url("cc").removesuffix("/v1"), cap)
    (row,) = calls(target.db, ro.id)
    assert_recorded(row)
    shown = [t["function"]["name"] for t in row.request["tools"]]
    assert "CronList" not in shown and "ToolSearch" in shown and len(shown) == len(cap["body"]["tools"]) - 1
    (tool_msg,) = [m for m in row.request["messages"] if m["role"] == "tool"]
    definition = json.loads(tool_msg["content"])
    schema = [t for t in cap["body"]["tools"] if t["name"] == "CronList"][0]["input_schema"]
    assert definition["name"] == "CronList" and definition["parameters"] == schema
    prompt = _prompt(target, row)
    # CronList reaches the model only inside the tool result that loaded it
    assert prompt.count('"name": "CronList"') == 1
    assert prompt.index("<tools>") < prompt.index("</tools>") < prompt.index('"name": "CronList"')


def test_opencode_messages_path_without_v1(target):
    hrl = HarnessRL(target.url)
    body = captured("opencode_main_call.json")["body"]
    assert all(t["eager_input_streaming"] for t in body["tools"])  # a streaming hint: accepted, ignored
    with hrl.rollout() as ro:
        base = f"{target.url}/r/{ro.id}/a/opencode"
        answer = httpx.post(base + "/messages", json=body)
        counted = httpx.post(base + "/messages/count_tokens", json=body)
        root = httpx.post(target.url + "/messages", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.text.startswith("event: message_start") and "event: message_stop" in answer.text  # it streams
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
    assert root.status_code == 200
    (row,) = calls(target.db, ro.id)
    assert row.agent == "opencode" and row.stream and len(row.request["tools"]) == len(body["tools"])
    # only the Anthropic path is served without /v1
    assert httpx.post(target.url + "/chat/completions", json={"model": "m", "messages": []}).status_code == 404


def test_hosted_tools_are_removed_and_recorded_or_refused_with_strict_tools(target, strict):
    web = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
    lookup = {"name": "lookup", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}
    args = dict(model="m", max_tokens=50, messages=[{"role": "user", "content": "hi"}], tools=[lookup, web])
    with HarnessRL(target.url).rollout() as ro:
        m = anthropic.Anthropic(base_url=ro.base_url("a").removesuffix("/v1"), api_key="x",
                                max_retries=0).messages.create(**args)
        r = openai.OpenAI(base_url=ro.base_url("r"), api_key="x", max_retries=0).responses.create(
            model="m", input="hi", tools=[{"type": "web_search"}, {"type": "function", "name": "lookup"}])
    rows = {row.id: row for row in calls(target.db, ro.id)}
    anth, resp = rows[m.id[4:]], rows[r.id[5:]]
    assert [t["function"]["name"] for t in anth.request["tools"]] == ["lookup"]
    assert anth.request["harnessrl_removed_tools"] == [
        {"path": "tools.1.type", "type": "web_search_20250305", "name": "web_search"}]
    assert [t["function"]["name"] for t in resp.request["tools"]] == ["lookup"]
    assert resp.request["harnessrl_removed_tools"] == [{"path": "tools[0].type", "type": "web_search", "name": None}]
    with pytest.raises(anthropic.BadRequestError, match=r"tools\.1\.type: the hosted tool 'web_search_20250305'"):
        anthropic.Anthropic(base_url=strict, api_key="x", max_retries=0).messages.create(**args)
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]\.type: the hosted tool 'web_search'"):
        openai.OpenAI(base_url=strict + "/v1", api_key="x", max_retries=0).responses.create(
            model="m", input="hi", tools=[{"type": "web_search"}])


PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


def test_an_image_in_a_tool_result_follows_the_tool_messages(target, tiny_model_dir, upstream, tokenizer_dir,
                                                             tmp_path):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}
    messages = [{"role": "user", "content": "Read the picture."},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read",
                                                   "input": {"file_path": "a.png"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                              "content": [{"type": "text", "text": "a.png:"}, image]},
                                             {"type": "text", "text": "What is in it?"}]}]
    read = {"name": "Read", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}
    args = dict(model="m", max_tokens=30, messages=messages, tools=[read])
    # a pass-through upstream (a vision model, say) gets it; the proxy's text-only model refuses it by name
    with serve_target("passthrough", tmp_path, tiny_model_dir, upstream, tokenizer_dir) as t:
        m = anthropic.Anthropic(base_url=t.url, api_key="x", max_retries=0).messages.create(**args)
        (row,) = [r for r in calls(t.db) if r.id == m.id[4:]]
    assert row.request["messages"][2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "a.png:"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + PIXEL}},
                                     {"type": "text", "text": "What is in it?"}]}]
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[3\]\.content\[0\] is an 'image_url' part"):
        anthropic.Anthropic(base_url=target.url, api_key="x", max_retries=0).messages.create(**args)


def _replay_responses(client: openai.OpenAI, body: dict) -> list:
    b = dict(body)
    core = {k: b.pop(k) for k in ("model", "input")}
    b.pop("stream")
    return list(client.responses.create(**core, stream=True, extra_body=b))


def test_codex_namespaces_and_custom_tools_come_back_as_declared(target):
    cap = captured("codex_additional_tools.json")
    assert cap["body"]["input"][0]["type"] == "additional_tools" and "tools" not in cap["body"]
    with HarnessRL(target.url).rollout() as ro:
        c = openai.OpenAI(base_url=ro.base_url("codex"), api_key="x", max_retries=0)
        events = _replay_responses(c, cap["body"])
        done = events[-1].response
        (call,) = [o for o in done.output if o.type == "custom_tool_call"]
        # the stand-in calls the first tool it is shown: Codex's `exec`, in the `functions` namespace
        assert call.name == "exec" and call.model_dump()["namespace"] == "functions"
        assert [e.type for e in events].count("response.custom_tool_call_input.done") == 1
        follow = [*cap["body"]["input"], call.model_dump(exclude_none=True),
                  {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "42"},
                  {"type": "configuration_update", "reasoning": {"effort": "high"}}]
        _replay_responses(c, {**cap["body"], "input": follow})
    first, second = calls(target.db, ro.id)
    assert_recorded(first)
    names = [t["function"]["name"] for t in first.request["tools"]]
    assert names[:2] == ["functions.exec", "functions.wait"] and "collaboration.spawn_agent" in names
    exec_tool = first.request["tools"][0]["function"]
    assert exec_tool["parameters"]["required"] == ["input"] and "lark grammar" in exec_tool["description"]
    assert first.tool_calls[0]["function"]["name"] == "functions.exec"
    assert len(first.request["harnessrl_context_tools"]) == 3  # the three namespaces
    tail = second.request["messages"][-2:]
    assert tail[0]["tool_calls"][0]["function"]["name"] == "functions.exec"
    assert json.loads(tail[0]["tool_calls"][0]["function"]["arguments"]) == {"input": call.input}
    assert tail[1] == {"role": "tool", "tool_call_id": call.call_id, "content": "42"}


def test_codex_function_tools_extend_and_hosted_ones_are_removed(target):
    cap = captured("codex_tools.json")
    with HarnessRL(target.url).rollout() as ro:
        c = openai.OpenAI(base_url=ro.base_url("codex"), api_key="x", max_retries=0)
        done = _replay_responses(c, cap["body"])[-1].response
        (call,) = [o for o in done.output if o.type == "function_call"]
        assert call.name == "exec_command" and call.model_dump().get("namespace") is None
        follow = [*cap["body"]["input"], *[o.model_dump(exclude_none=True) for o in done.output],
                  {"type": "function_call_output", "call_id": call.call_id, "output": "ok"}]
        _replay_responses(c, {**cap["body"], "input": follow})
    first, second = calls(target.db, ro.id)
    assert [t["type"] for t in first.request["harnessrl_removed_tools"]] == ["web_search"]
    assert first.request["harnessrl_surface"]["tool_names"] == {"apply_patch": [None, "apply_patch", "custom"],
                                                                "tool_search": [None, "tool_search", "tool_search"]}
    assert_extends(first, second)


def test_codex_client_tool_search_loads_tools_into_the_conversation(target):
    cap = captured("codex_tools.json")["body"]
    search = [t for t in cap["tools"] if t["type"] == "tool_search"]
    assert search[0]["execution"] == "client"
    loaded = captured("codex_tool_search_output.json")["item"]
    body = {**cap, "tools": search}  # the stand-in calls the first tool it is shown
    with HarnessRL(target.url).rollout() as ro:
        c = openai.OpenAI(base_url=ro.base_url("codex"), api_key="x", max_retries=0)
        done = _replay_responses(c, body)[-1].response
        (call,) = [o.model_dump(exclude_none=True) for o in done.output if o.type == "tool_search_call"]
        assert call["execution"] == "client" and isinstance(call["arguments"], dict)
        follow = [*cap["input"], *[o.model_dump(exclude_none=True) for o in done.output],
                  {**loaded, "call_id": call["call_id"]}]
        _replay_responses(c, {**body, "input": follow})
    first, second = calls(target.db, ro.id)
    assert_extends(first, second)
    # the loaded tools reach the model in the tool message, not among the tools shown up front
    assert [t["function"]["name"] for t in second.request["tools"]] == ["tool_search"]
    shown = [json.loads(line) for line in second.request["messages"][-1]["content"].splitlines()]
    assert [f["name"] for f in shown][:1] == ["multi_agent_v1.spawn_agent"]
    assert shown[0]["description"].startswith(loaded["tools"][0]["description"])
    assert second.request["harnessrl_loaded_tools"] == loaded["tools"]
    names = second.request["harnessrl_surface"]["tool_names"]
    assert names["multi_agent_v1.spawn_agent"] == ["multi_agent_v1", "spawn_agent", "function"]


@pytest.mark.parametrize("path, body, where", [
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "foo": 1},
     "foo"),
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                      "output_config": {"effort": "low", "colour": "red"}}, "output_config.colour"),
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                      "tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools.0.type"),
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "ToolSearch", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "tool_reference", "tool_name": "Nope"}]}]}]}, "messages.2.content.0.content.0.tool_name"),
    ("/v1/messages", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                      "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                      "tool_choice": {"type": "tool", "name": "web_search"}}, "tool_choice.name"),
    ("/v1/responses", {"model": "m", "input": "x", "tools": [{"type": "function", "name": "f"}],
                       "tool_choice": {"type": "function", "name": "g"}}, "tool_choice.name"),
    ("/v1/responses", {"model": "m", "input": "x", "foo": 1}, "foo"),
    ("/v1/responses", {"model": "m", "input": "x", "generate": False}, "generate"),
    ("/v1/responses", {"model": "m", "input": [{"type": "web_search_call", "id": "w"}]}, "input[0].type"),
    ("/v1/responses", {"model": "m", "input": "x", "tools": [{"type": "local_shell"}]}, "tools[0].type"),
    ("/v1/responses", {"model": "m", "input": "x", "tools": [
        {"type": "namespace", "name": "a", "tools": [{"type": "web_search"}]}]}, "tools[0].tools[0].type"),
    ("/v1/responses", {"model": "m", "input": "x", "tools": [
        {"type": "custom", "name": "c", "format": {"type": "grammar", "syntax": "peg", "definition": ""}}]},
     "tools[0].format"),
])
def test_what_is_not_served_is_a_400_naming_it(target, path, body, where):
    resp = httpx.post(target.url + path, json=body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["message"].startswith(where + ":"), err


def _sse(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_gemini_cli_calls_are_served_and_its_tool_turn_extends_the_call_before(target):
    first, turn = captured("gemini_cli_first_call.json"), captured("gemini_cli_tool_turn.json")
    decls = first["body"]["tools"][0]["functionDeclarations"]
    with HarnessRL(target.url).rollout() as ro:
        base = ro.base_url("gemini").removesuffix("/v1")  # GOOGLE_GEMINI_BASE_URL: no /v1
        headers = {**first["headers"], "x-goog-api-key": "unused"}
        r1 = httpx.post(base + first["path"], json=first["body"], headers=headers, timeout=60)
        assert r1.status_code == 200 and r1.headers["content-type"].startswith("text/event-stream"), r1.text
        parts = [p for c in _sse(r1.text) for p in c["candidates"][0]["content"]["parts"]]
        assert parts[0].get("thought")  # the stand-in thinks first
        # Gemini CLI keeps the answer in its history without the thought parts, signature kept
        kept = [p for p in parts if not p.get("thought")]
        assert kept[0]["thoughtSignature"]
        call = next(p["functionCall"] for p in kept if "functionCall" in p)
        contents = [*first["body"]["contents"], {"role": "model", "parts": kept}, {"role": "user", "parts": [
            {"functionResponse": {"id": call["id"], "name": call["name"], "response": {"output": "hello"}}}]}]
        r2 = httpx.post(base + first["path"], json={**first["body"], "contents": contents}, headers=headers, timeout=60)
        # the captured tool turn (another session's: a root here), with the signature the proxy gave it
        r3 = httpx.post(base + turn["path"], json=turn["body"], headers=headers, timeout=60)
    assert r2.status_code == r3.status_code == 200
    rows = calls(target.db, ro.id)
    assert [r.agent for r in rows] == ["gemini"] * 3 and {r.client for r in rows} == {first["headers"]["user-agent"]}
    req = rows[0].request
    assert req["messages"][0] == {"role": "system", "content": first["body"]["systemInstruction"]["parts"][0]["text"]}
    assert req["messages"][1]["content"] == "\n".join(p["text"] for p in first["body"]["contents"][0]["parts"])
    # parametersJsonSchema is the function's parameters as sent; topK, topP and temperature the sampling
    assert [t["function"] for t in req["tools"]] == [
        {"name": d["name"], "description": d["description"], "parameters": d["parametersJsonSchema"]} for d in decls]
    assert (req["temperature"], req["top_p"], req["top_k"]) == (1, 0.95, 64)
    assert req["harnessrl_surface"]["body"]["generationConfig"]["thinkingConfig"] == {"includeThoughts": True}
    assert_extends(rows[0], rows[1])  # the thoughts came back through the signature
    # the captured turn: its signature's reasoning is the assistant turn's, Gemini CLI's shell output its tool result
    assistant, tool = rows[2].request["messages"][-2:]
    assert assistant["content"] == "<think>\nI will run a command and report what it prints.\n</think>"
    assert assistant["tool_calls"][0]["function"]["name"] == "run_shell_command"
    assert tool["role"] == "tool" and "hrl-tool-ran" in tool["content"]
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]


def test_gemini_hosted_tools_are_removed_and_recorded_or_refused_with_strict_tools(target, strict):
    body = {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 20},
            "tools": [{"googleSearch": {}}, {"functionDeclarations": [{"name": "lookup", "parametersJsonSchema": {
                "type": "object", "properties": {"q": {"type": "string"}}}}]}]}
    with HarnessRL(target.url).rollout() as ro:
        r = httpx.post(f"{target.url}/r/{ro.id}/a/g/v1beta/models/m:generateContent", json=body)
    assert r.status_code == 200, r.text
    (row,) = calls(target.db, ro.id)
    assert [t["function"]["name"] for t in row.request["tools"]] == ["lookup"]
    assert row.request["harnessrl_removed_tools"] == [{"path": "tools[0].googleSearch", "type": "googleSearch",
                                                       "name": None}]
    refused = httpx.post(f"{strict}/v1beta/models/m:generateContent", json=body)
    assert refused.status_code == 400 and refused.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert refused.json()["error"]["message"].startswith("tools[0].googleSearch: the hosted tool 'googleSearch'")
