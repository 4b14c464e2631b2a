"""Every failed call is answered with an OpenAI-shaped error and leaves a failed-call record:
a chat template that rejects the messages, a malformed upstream stream chunk, token ids or
usage of the wrong type from the upstream (each of these once escaped with no record)."""

from __future__ import annotations

import shutil

import openai
import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.proxy.upstream.vllm_wire import Extract, checked
from harnessrl.records import Call

# well-formed messages a strict chat template refuses (as Llama's and Mistral's do with
# raise_exception when roles do not alternate)
UNRENDERABLE = [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]
_STRICT = ("{%- for m in messages[1:] -%}{%- if m['role'] == messages[loop.index0]['role'] -%}"
           "{{ raise_exception('Conversation roles must alternate') }}{%- endif -%}{%- endfor -%}\n")
MSGS = [{"role": "user", "content": "What is the capital of the river country?"}]


def _calls(db: str) -> list[Call]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(Call).order_by(Call.created_at)))
    engine.dispose()
    return rows


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def strict_tokenizer_dir(tokenizer_dir, tmp_path):
    out = tmp_path / "strict"
    shutil.copytree(tokenizer_dir, out)
    template = out / "chat_template.jinja"
    template.write_text(_STRICT + template.read_text())
    return out


def test_template_failure_is_a_400_and_a_failed_record(upstream, strict_tokenizer_dir, db_target):
    cfg = ProxyConfig(db=db_target, upstream=upstream, port=0, prefix=True, tokenizer=str(strict_tokenizer_dir))
    with run_proxy(cfg) as proxy:
        client = _client(proxy.url)
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as err:
                out = client.chat.completions.create(model="m", messages=UNRENDERABLE, stream=stream)
                list(out) if stream else None
            assert err.value.status_code == 400 and err.value.body["code"] == "template_error"
            assert err.value.response.headers["x-harnessrl-call"]
    calls = _calls(db_target)
    assert [(c.status, c.stream, c.completion_ids) for c in calls] == [("error", False, None), ("error", True, None)]
    assert all(c.error.startswith("400 invalid_request_error: cannot render") for c in calls)
    assert calls[0].request["messages"] == UNRENDERABLE


def test_malformed_stream_chunk_ends_the_stream_with_an_error_and_is_recorded(upstream, db_target):
    with run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0)) as proxy:
        stream = _client(proxy.url).chat.completions.create(model="bad-chunk", messages=MSGS, stream=True)
        got = []
        with pytest.raises(openai.APIError, match="malformed upstream response"):
            for chunk in stream:
                got.append(chunk)
    assert got and got[0].choices[0].delta.role == "assistant"  # the stream had started: 200, then the error
    (call,) = _calls(db_target)
    assert call.status == "error" and call.error.startswith("502 upstream_error: malformed upstream response")


@pytest.mark.parametrize("fault", ["bad-ids", "bad-usage"])
def test_bad_ids_or_usage_from_the_upstream_are_a_502_and_a_failed_record(upstream, tmp_path, fault):
    db = str(tmp_path / "runs.db")  # the DB side runs on both DBs in the tests above
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        client = _client(proxy.url)
        with pytest.raises(openai.APIStatusError) as chat:
            client.chat.completions.create(model=fault, messages=MSGS)
        with pytest.raises(openai.APIStatusError) as text:
            client.completions.create(model=fault, prompt="hello")
    for err in (chat, text):
        assert err.value.status_code == 502 and err.value.body["code"] == "upstream_malformed"
    calls = _calls(db)
    assert [(c.endpoint, c.status) for c in calls] == [("chat", "error"), ("completions", "error")]
    assert all(c.error.startswith("502 upstream_error: malformed upstream response") for c in calls)


@pytest.mark.parametrize("ids", [["7"], [1.5], [2 ** 31], [-2 ** 31 - 1], [[1]], (1, 2), "12"])
def test_token_ids_that_are_not_int32_are_malformed(ids):
    with pytest.raises(ValueError, match="int32"):
        checked(Extract(prompt_ids=ids))
    with pytest.raises(ValueError, match="int32"):
        checked(Extract(completion_ids=[0, *ids] if isinstance(ids, list) else ids))


def test_token_ids_at_the_int32_bounds_are_kept_exactly():
    ex = checked(Extract(prompt_ids=[-2 ** 31, 0, 2 ** 31 - 1], completion_ids=[]))
    assert ex.prompt_ids.tolist() == [-2 ** 31, 0, 2 ** 31 - 1] and ex.completion_ids.tolist() == []
    assert ex.prompt_ids.itemsize == 4


def test_bad_ids_from_a_token_upstream_are_a_502_and_a_failed_record(upstream, tokenizer_dir, tmp_path):
    db = str(tmp_path / "runs.db")
    cfg = ProxyConfig(db=db, upstream=upstream, port=0, prefix=True, tokenizer=str(tokenizer_dir),
                      upstream_model="bad-ids")  # the token route asks the upstream for this model
    with run_proxy(cfg) as proxy:
        with pytest.raises(openai.APIStatusError) as err:
            _client(proxy.url).chat.completions.create(model="m", messages=MSGS)
    assert err.value.status_code == 502 and err.value.body["code"] == "upstream_malformed"
    (call,) = _calls(db)
    assert call.status == "error" and call.prompt_path == "render"
