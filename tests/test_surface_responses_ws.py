"""The Responses API's WebSocket transport, driven by real WebSocket clients (the `websockets`
package, and the openai SDK's `responses.connect()`) over a real socket, replaying what Codex
0.171 sends (tests/cli_requests/codex_websocket.json: a warm-up, the turn chained to it, the
function call's output chained to that) against the proxy in front of the vLLM stand-in with
prefix-consistent prompts."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from harnessrl.client import HarnessRL
from surface_fixtures import assert_extends, assert_recorded, calls, serve_target

CAPTURED = json.loads((Path(__file__).parent / "cli_requests" / "codex_websocket.json").read_text())


@pytest.fixture(scope="module")
def target(tiny_model_dir, upstream, tokenizer_dir, tmp_path_factory):
    with serve_target("standin", tmp_path_factory.mktemp("ws"), tiny_model_dir, upstream, tokenizer_dir,
                      api_key="sekret") as t:
        yield t


def _ws_url(http_url: str) -> str:
    return "ws" + http_url.removeprefix("http")


def _events(ws) -> list[dict]:
    """The events of one response, up to its last."""
    out = []
    while True:
        out.append(json.loads(ws.recv(timeout=30)))
        if out[-1]["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
            return out


def test_codex_turn_over_the_socket_is_served_and_recorded_like_a_post(target):
    warm, turn, after_call = CAPTURED["messages"]
    assert warm["generate"] is False and turn["previous_response_id"] and after_call["previous_response_id"]
    assert turn["store"] is False  # chained to by id anyway: the connection keeps its last response
    hrl = HarnessRL(target.url, api_key="sekret")
    with hrl.rollout() as ro:
        headers = {"Authorization": "Bearer sekret", "OpenAI-Beta": CAPTURED["headers"]["openai-beta"],
                   "User-Agent": "codex_exec/0.171.0"}
        with connect(_ws_url(ro.base_url("codex")) + "/responses", additional_headers=headers) as ws:
            ws.send(json.dumps(warm))
            w = _events(ws)
            assert [e["type"] for e in w] == ["response.created", "response.in_progress", "response.completed"]
            assert w[-1]["response"]["output"] == [] and w[-1]["response"]["id"].startswith("resp_")
            ws.send(json.dumps({**turn, "previous_response_id": w[-1]["response"]["id"]}))
            first = _events(ws)
            assert first[-1]["type"] == "response.completed", first[-1]
            (call,) = [o for o in first[-1]["response"]["output"] if o["type"] == "function_call"]
            assert call["name"] == "exec_command"
            output = {**after_call["input"][0], "call_id": call["call_id"]}
            ws.send(json.dumps({**after_call, "input": [output], "previous_response_id": first[-1]["response"]["id"]}))
            second = _events(ws)
            assert second[-1]["type"] == "response.completed", second[-1]
    # the warm-up generated nothing and left no record; each turn is one call, as over HTTP
    one, two = calls(target.db, ro.id)
    assert [one.id, two.id] == [first[-1]["response"]["id"][5:], second[-1]["response"]["id"][5:]]
    assert one.surface == two.surface == "responses-ws" and one.client == "codex_exec/0.171.0"
    assert one.agent == "codex" and one.stream
    assert_recorded(one)
    # the warm-up's input comes first in the conversation the first turn extends
    warm_text = warm["input"][0]["content"][0]["text"]
    assert one.request["messages"][0] == {"role": "developer", "content": warm_text}
    assert one.request["messages"][1]["content"] == "".join(p["text"] for p in turn["input"][0]["content"])
    assert [t["type"] for t in one.request["harnessrl_removed_tools"]] == ["web_search"]
    assert_extends(one, two)
    assert two.request["messages"][-1] == {"role": "tool", "tool_call_id": call["call_id"],
                                           "content": output["output"]}


def test_errors_are_events_and_the_connection_stays_open(target):
    url = _ws_url(target.url) + "/v1/responses"
    with connect(url, additional_headers={"Authorization": "Bearer sekret"}) as ws:
        ws.send("{nope")
        (bad,) = _events(ws)
        assert bad["status"] == 400 and bad["error"]["code"] == "invalid_json"
        ws.send('{"a":' * 300 + "1" + "}" * 300)  # deeper than a body may be: still a 400, not a dead socket
        (deep,) = _events(ws)
        assert deep["status"] == 400 and "nested" in deep["error"]["message"]
        ws.send(json.dumps({"type": "response.cancel"}))
        (other,) = _events(ws)
        assert other["status"] == 400 and other["error"]["param"] == "type"
        ws.send(json.dumps({"type": "response.create", "model": "m", "input": "x", "tools": [{"type": "shell"}]}))
        (refused,) = _events(ws)
        assert refused["status"] == 400 and refused["error"]["message"].startswith("tools[0].type:")
        ws.send(json.dumps({"type": "response.create", "model": "m", "input": "x", "previous_response_id": "resp_x"}))
        (missing,) = _events(ws)
        assert missing["status"] == 400 and missing["error"]["code"] == "previous_response_not_found"
        ws.send(json.dumps({"type": "response.create", "model": "m", "input": "hello", "max_output_tokens": 30}))
        ok = _events(ws)
        assert ok[-1]["type"] in ("response.completed", "response.incomplete")
        # sequence numbers run per response, as on the SSE stream
        assert [e["sequence_number"] for e in ok] == list(range(len(ok)))


def test_the_handshake_is_refused_as_a_post_would_be(target):
    with pytest.raises(InvalidStatus) as e:
        connect(_ws_url(target.url) + "/v1/responses", additional_headers={"Authorization": "Bearer wrong"})
    assert e.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as e:
        connect(_ws_url(target.url) + "/r/bad:id/a/x/v1/responses", additional_headers={
            "Authorization": "Bearer sekret"})
    assert e.value.response.status_code == 400


def test_the_openai_sdk_websocket_client(target):
    client = openai.OpenAI(base_url=target.url + "/v1", api_key="sekret", max_retries=0)
    with client.responses.connect() as conn:
        conn.response.create(model="m", input="What is the capital of france?", max_output_tokens=40)
        kinds = []
        for event in conn:
            kinds.append(event.type)
            if event.type in ("response.completed", "response.incomplete", "error"):
                break
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert calls(target.db)[-1].surface == "responses-ws"
