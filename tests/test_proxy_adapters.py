"""A new API surface is an adapter: it translates its request to the internal chat request and
renders the result in its own wire format, and both routes serve it unchanged. The adapter
here is a small Anthropic-Messages-like one (text only), written the way a real one would be."""

from __future__ import annotations

import httpx
import orjson
import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.app import ADAPTERS
from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.protocol import Delta, Request, Result
from harnessrl.proxy.surfaces.adapter import Adapter
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.proxy.validate import check_chat
from harnessrl.records import Call, unpack_ids

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _to_chat(body: dict) -> Request:
    system = [{"role": "system", "content": body["system"]}] if body.get("system") else []
    chat = {"model": body.get("model"), "max_tokens": body["max_tokens"], "stream": bool(body.get("stream")),
            "messages": system + body["messages"]}
    check_chat(chat)  # what the routes rely on, checked like an OpenAI chat body
    return Request(chat)


class _MessagesWire:
    def __init__(self, req: Request, call_id: str, model: str) -> None:
        self.id = f"msg_{call_id}"

    def response(self, r: Result) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "content": [{"type": "text", "text": r.text}],
                "stop_reason": _STOP.get(r.finish_reason or ""), "usage": {
                    "input_tokens": r.usage["prompt_tokens"], "output_tokens": r.usage["completion_tokens"]}}

    def chunks(self, deltas: list[Delta]) -> bytes:
        return b"".join(_event("content_block_delta", {"delta": {"type": "text_delta", "text": d.content}})
                        for d in deltas if d.content)

    def close(self, r: Result) -> bytes:
        return _event("message_delta", {"delta": {"stop_reason": _STOP.get(r.finish_reason or "")}}) + _event(
            "message_stop", {})

    def error(self, err: ProxyError) -> bytes:
        return _event("error", {"error": {"type": err.type, "message": err.message}})


def _event(kind: str, data: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


MESSAGES = Adapter("messages", _to_chat, _MessagesWire)
BODY = {"model": "m", "max_tokens": 64, "system": "Be brief.",
        "messages": [{"role": "user", "content": "What is the capital of the river country?"}]}


@pytest.mark.parametrize("route", ["passthrough", "tokens"])
def test_an_added_adapter_is_served_by_both_routes_and_recorded_as_chat(upstream, tokenizer_dir, tmp_path, route):
    db = str(tmp_path / "runs.db")
    cfg = ProxyConfig(db=db, upstream=upstream, port=0, prefix=route == "tokens", tokenizer=str(tokenizer_dir))
    with run_proxy(cfg, adapters=(*ADAPTERS, MESSAGES)) as proxy, httpx.Client(base_url=proxy.url) as http:
        chat = http.post("/v1/chat/completions", json={
            "model": "m", "max_tokens": 64, "messages": [{"role": "system", "content": "Be brief."}, *BODY["messages"]]})
        plain = http.post("/v1/messages", json=BODY)
        streamed = http.post("/v1/messages", json={**BODY, "stream": True})
        bad = http.post("/v1/messages", json={**BODY, "max_tokens": -1})
    assert chat.status_code == plain.status_code == streamed.status_code == 200
    text = chat.json()["choices"][0]["message"]["content"]
    assert plain.json()["content"] == [{"type": "text", "text": text}] and plain.json()["stop_reason"] == "end_turn"
    events = [orjson.loads(line[5:]) for line in streamed.text.splitlines() if line.startswith("data:")]
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == text
    assert events[-1]["type"] == "message_stop"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"  # refused: a failed call
    engine, Session = open_db(db)
    with Session() as s:
        calls = list(s.scalars(select(Call).order_by(Call.created_at)))
    engine.dispose()
    # the records hold the chat request the model saw, and the same tokens whatever the surface
    assert [(c.endpoint, c.surface, c.status) for c in calls] == [
        ("chat", "chat", "ok"), ("chat", "messages", "ok"), ("chat", "messages", "ok"), ("chat", "messages", "error")]
    calls = calls[:3]
    assert calls[1].request["messages"][0] == {"role": "system", "content": "Be brief."}
    assert calls[1].response["content"][0]["text"] == text
    ids = unpack_ids(calls[0].completion_ids).tolist()
    assert ids and all(unpack_ids(c.completion_ids).tolist() == ids for c in calls[1:])
