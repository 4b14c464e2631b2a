"""The whole chat request is checked before any work: a malformed body gets an OpenAI-shaped 400
whose `param` is the path of the bad field, never a 500 (a non-string role once crashed the
validator; a malformed message once crashed the prefix index's comparison in a session with an
earlier turn), and an out-of-range number is refused instead of silently replaced
(`max_tokens: 0` once became 256)."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, select

from harnessrl.db import open_db
from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.proxy.validate import check_chat, check_completion
from harnessrl.records import Call

USER = {"role": "user", "content": "What is the capital of the river country?"}
CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}

# (what replaces the assistant reply in the second turn, the param the 400 names)
BAD_MESSAGES = [
    ({"role": ["assistant"], "content": "x"}, "messages[1].role"),
    ({"role": {}, "content": "x"}, "messages[1].role"),
    ({"role": "robot", "content": "x"}, "messages[1].role"),
    ("assistant", "messages[1]"),
    ({"role": "assistant", "content": [{"type": "text", "text": 5}]}, "messages[1].content[0].text"),
    ({"role": "assistant", "content": [{"type": "text"}]}, "messages[1].content[0].text"),
    ({"role": "assistant", "content": [{"text": "x"}]}, "messages[1].content[0]"),
    ({"role": "assistant", "content": ["x"]}, "messages[1].content[0]"),
    ({"role": "assistant", "content": 5}, "messages[1].content"),
    ({"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": "lookup"}]},
     "messages[1].tool_calls[0].function"),
    ({"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": None}]},
     "messages[1].tool_calls[0].function"),
    ({"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": ["lookup"]}]},
     "messages[1].tool_calls[0].function"),
    ({"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": 1, "arguments": "{}"}}]},
     "messages[1].tool_calls[0].function.name"),
    ({"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {}}}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"role": "assistant", "content": None, "tool_calls": {"0": CALL}}, "messages[1].tool_calls"),
    ({"role": "assistant", "content": None, "tool_calls": ["call"]}, "messages[1].tool_calls[0]"),
    ({"role": "tool", "content": "x", "tool_call_id": 7}, "messages[1].tool_call_id"),
]

# (fields merged into a valid request, the param the 400 names)
BAD_FIELDS = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": [1]}, "logit_bias"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options"),
    ({"model": "m" * 257}, "model"),
    ({"model": "m\x00"}, "model"),
    ({"tools": [{"type": "function", "function": "lookup"}]}, "tools[0].function"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]},
     "tools[0].function.description"),
    ({"tools": [TOOL], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": "lookup"}}, "tool_choice"),
    ({"top_logprobs": 21}, "top_logprobs"),
]


def _body(**extra) -> dict:
    return {"model": "m", "messages": [USER], "max_tokens": 8, **extra}


def _param(fn, body: dict) -> str | None:
    with pytest.raises(ProxyError) as err:
        fn(body)
    assert err.value.status == 400
    return err.value.param


@pytest.mark.unit
@pytest.mark.parametrize(("bad", "param"), BAD_MESSAGES)
def test_a_malformed_message_names_its_path(bad, param):
    assert _param(check_chat, _body(messages=[USER, bad])) == param


@pytest.mark.unit
@pytest.mark.parametrize(("fields", "param"), BAD_FIELDS)
def test_a_bad_field_names_itself(fields, param):
    assert _param(check_chat, _body(**fields)) == param


@pytest.mark.unit
def test_valid_requests_pass():
    check_chat(_body(messages=[{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, USER,
                               {"role": "assistant", "content": None, "tool_calls": [CALL]},
                               {"role": "tool", "tool_call_id": "c1", "content": "Paris"}],
                     tools=[TOOL], tool_choice={"type": "function", "function": {"name": "lookup"}},
                     temperature=2, top_p=1, presence_penalty=-2, frequency_penalty=2, stop=["a", "b", "c", "d"],
                     logit_bias={"17": -100}, stream=True, stream_options={"include_usage": True}))
    check_completion({"prompt": [1, 2, 3], "max_tokens": 1})
    assert _param(check_completion, {"prompt": "x", "max_tokens": 0}) == "max_tokens"


def _count(db: str, status: str) -> int:
    engine, Session = open_db(db)
    with Session() as s:
        n = s.scalar(select(func.count()).select_from(Call).where(Call.status == status))
    engine.dispose()
    return n


@pytest.mark.parametrize("prefix", [False, True])
def test_a_session_with_an_earlier_turn_gets_400s_not_500s(upstream, tokenizer_dir, tmp_path, prefix):
    """Through a real proxy: the second turn of a session is compared with the first by the prefix
    index, which is where malformed messages used to crash."""
    db = str(tmp_path / "runs.db")
    cfg = ProxyConfig(db=db, upstream=upstream, port=0, prefix=prefix, tokenizer=str(tokenizer_dir))
    with run_proxy(cfg) as proxy, httpx.Client(base_url=proxy.url, timeout=30) as http:
        headers = {"x-harnessrl-session": "s1"}
        first = http.post("/v1/chat/completions", json=_body(), headers=headers)
        assert first.status_code == 200
        reply = first.json()["choices"][0]["message"]
        assert http.post("/v1/chat/completions", json=_body(messages=[USER, reply, USER]),
                         headers=headers).status_code == 200
        for bad, param in BAD_MESSAGES:
            r = http.post("/v1/chat/completions", json=_body(messages=[USER, bad, USER]), headers=headers)
            assert (r.status_code, r.json()["error"]["param"]) == (400, param), r.text
        for fields, param in BAD_FIELDS:
            r = http.post("/v1/chat/completions", json=_body(messages=[USER, reply, USER], **fields), headers=headers)
            assert (r.status_code, r.json()["error"]["param"]) == (400, param), r.text
    assert _count(db, "ok") == 2  # refused requests never reach the model
    assert _count(db, "error") == len(BAD_MESSAGES) + len(BAD_FIELDS)  # each is recorded as a refused call


@pytest.mark.unit
def test_an_unexpected_backend_error_is_logged_not_answered(caplog):
    from harnessrl.proxy.errors import as_proxy_error

    with caplog.at_level("ERROR", logger="harnessrl.proxy"):
        err = as_proxy_error(RuntimeError("INSERT INTO calls VALUES ('secret-param')"), "call123")
    assert err.status == 500 and "secret-param" not in err.message and "INSERT" not in err.message
    assert "call123" in caplog.text and "secret-param" in caplog.text  # the operator still has it


def test_a_body_nested_too_deep_to_forward_or_record_is_a_400(upstream, tmp_path):
    """orjson reads 1,024 levels but writes 254: such a body was read, then failed (500) when
    forwarded or recorded."""
    deep = "[" * 300 + "]" * 300
    body = ('{"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "x", "extra": ' + deep + "}]}")
    with run_proxy(ProxyConfig(db=str(tmp_path / "runs.db"), upstream=upstream, port=0)) as proxy:
        r = httpx.post(proxy.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text


@pytest.mark.parametrize("prefix", [False, True])
def test_token_ids_outside_the_vocabulary_are_a_400(upstream, tokenizer_dir, tmp_path, prefix):
    """Found by the fuzz: a Completions prompt of token ids beyond int32 (or beyond the model's
    vocabulary, on a token route) crashed the backend with a 500."""
    cfg = ProxyConfig(db=str(tmp_path / "runs.db"), upstream=upstream, port=0, prefix=prefix,
                      tokenizer=str(tokenizer_dir))
    with run_proxy(cfg) as proxy, httpx.Client(base_url=proxy.url, timeout=30) as http:
        huge = http.post("/v1/completions", json={"model": "m", "max_tokens": 1, "prompt": [2**31]})
        assert (huge.status_code, huge.json()["error"]["param"]) == (400, "prompt"), huge.text
        if prefix:  # the proxy tokenizes: it knows the vocabulary
            beyond = http.post("/v1/completions", json={"model": "m", "max_tokens": 1, "prompt": [1, 10**7]})
            assert (beyond.status_code, beyond.json()["error"]["param"]) == (400, "prompt"), beyond.text
