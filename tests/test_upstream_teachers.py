"""Teachers through the same proxy: an HTTPS upstream verified against a CA made here (the vLLM
stand-in behind TLS, with its key check), and hosted-model dialects — an Anthropic Messages
stand-in and an OpenAI Responses server (a second harnessrl proxy) — that return no token ids.
The harness is the openai SDK speaking chat; what is recorded from a text-only teacher is never
a sample but becomes an expert trace; the upstream key is in no DB file and no log."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import trustme
from sqlalchemy import select

from harnessrl.client import HarnessRL
from harnessrl.compiler.pipeline import CompileOptions, Compiler
from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import TEXT_ONLY, Call

KEY = "sk-teacher-7f3a9c"
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look up a key.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
CLI = [sys.executable, "-m", "harnessrl"]


def _db_bytes(db: str) -> bytes:
    return b"".join(p.read_bytes() for p in Path(db).parent.glob(Path(db).name + "*"))


@pytest.fixture(scope="module")
def tls_upstream(tokenizer_dir, tmp_path_factory):
    """The vLLM stand-in over HTTPS with a certificate from a CA made here; (url, CA file, auth seen)."""
    from asgi_thread import serve_in_thread
    from vllm_standin import create_app

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    d = tmp_path_factory.mktemp("tls")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    app = create_app(str(tokenizer_dir), api_key=KEY)
    with serve_in_thread(app, ssl_certfile=str(d / "cert.pem"), ssl_keyfile=str(d / "key.pem")) as url:
        yield url.replace("http://", "https://"), str(d / "ca.pem"), app.state.auth_seen


def test_https_upstream_verified_with_the_given_ca_and_keyed(tls_upstream, tmp_path, caplog):
    url, ca_file, seen = tls_upstream
    db = str(tmp_path / "runs.db")
    cfg = ProxyConfig(db=db, upstream=url + "/v1", upstream_ca=ca_file, upstream_api_key=KEY, port=0, log_level="debug")
    with caplog.at_level(logging.DEBUG), run_proxy(cfg) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="harness-own-key", max_retries=0)
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True) if c.choices)
        assert reply.choices[0].message.content and streamed
        assert httpx.get(proxy.url + "/ready").json()["checks"]["upstream"] == "ok"
    assert set(seen) == {f"Bearer {KEY}"}  # the proxy's key, never the harness's
    _, Session = open_db(db)
    with Session() as s:
        calls = s.scalars(select(Call)).all()
    assert [c.status for c in calls] == ["ok", "ok"] and all(c.prompt_ids and c.completion_ids for c in calls)
    assert KEY.encode() not in _db_bytes(db) and KEY not in caplog.text


def test_https_upstream_not_trusted_without_its_ca(tls_upstream, tmp_path):
    url, _, _ = tls_upstream
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, upstream=url, upstream_api_key=KEY, port=0)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert err.value.status_code == 502 and "not trusted" in err.value.message and "--upstream-ca" in err.value.message
    _, Session = open_db(db)
    with Session() as s:
        assert [c.status for c in s.scalars(select(Call))] == ["error"]  # the failure leaves a record
    with pytest.raises(UserError, match="upstream-ca"):
        ProxyConfig(db=db, upstream=url, upstream_ca=str(tmp_path / "missing.pem")).check()


@pytest.fixture(scope="module")
def anthropic_upstream():
    from anthropic_standin import create_app
    from asgi_thread import serve_in_thread

    app, requests = create_app(KEY)
    with serve_in_thread(app) as url:
        yield url, requests


def _tool_round_trip(base_url: str, stream: bool) -> tuple[str, str | None]:
    """A chat harness's tool loop: question → tool call → tool result → answer."""
    client = openai.OpenAI(base_url=base_url, api_key="harness-own-key", max_retries=0)
    messages = [{"role": "system", "content": "Use the tool."}, {"role": "user", "content": "What is stored under pi?"}]

    def ask():
        if not stream:
            return client.chat.completions.create(model="claude-standin", messages=messages, tools=TOOLS,
                                                  max_tokens=64).choices[0].message
        text, calls = "", {}
        for chunk in client.chat.completions.create(model="claude-standin", messages=messages, tools=TOOLS,
                                                    max_tokens=64, stream=True):
            if not chunk.choices:
                continue
            d = chunk.choices[0].delta
            text += d.content or ""
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                c["name"] += (tc.function.name or "") if tc.function else ""
                c["arguments"] += (tc.function.arguments or "") if tc.function else ""
        return type("M", (), {"content": text or None, "tool_calls": [
            type("T", (), {"id": c["id"], "function": type("F", (), {"name": c["name"], "arguments": c["arguments"]})})
            for c in calls.values()] or None})

    first = ask()
    call = first.tool_calls[0]
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"query": "pi"}
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "lookup", "arguments": call.function.arguments}}]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "3.14"})
    return ask().content, call.id


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_teacher_recorded_text_only_and_never_a_sample(anthropic_upstream, tiny_model_dir, tmp_path,
                                                                  caplog, stream):
    url, requests = anthropic_upstream
    requests.clear()
    db = str(tmp_path / "runs.db")
    cfg = ProxyConfig(db=db, upstream=url, upstream_dialect="anthropic", upstream_api_key=KEY, port=0,
                      log_level="debug")
    with caplog.at_level(logging.DEBUG), run_proxy(cfg) as proxy:
        hrl = HarnessRL(proxy.url)
        with hrl.rollout(task_id="pi", run="teacher") as ro:
            answer, call_id = _tool_round_trip(ro.base_url("agent"), stream)
            ro.reward(1.0)
        assert httpx.get(proxy.url + "/ready").json()["checks"]["upstream"] == "ok"
    assert answer == "The answer is <answer>3.14</answer>."
    # what the provider got: Anthropic's wire format, its own key, never the harness's
    first, second = (r["body"] for r in requests)
    assert first["system"] == "Use the tool." and first["tools"][0]["input_schema"]["required"] == ["query"]
    assert second["messages"][-1]["content"] == [{"type": "tool_result", "tool_use_id": call_id, "content": "3.14"}]
    assert all(r["headers"]["x-api-key"] == KEY and r["headers"]["anthropic-version"] for r in requests)
    assert all("authorization" not in r["headers"] for r in requests)
    _, Session = open_db(db)
    with Session() as s:
        calls = s.scalars(select(Call).order_by(Call.seq)).all()
        assert [(c.status, c.prompt_path, c.prompt_ids, c.completion_ids) for c in calls] == [
            ("ok", TEXT_ONLY, None, None)] * 2
        assert calls[1].response_text == "The answer is <answer>3.14</answer>." and calls[0].tool_calls
    assert KEY.encode() not in _db_bytes(db) and KEY not in caplog.text

    # compile: counted, never a sample (no sampled ids or log-probs to train on)
    stats = Compiler(db, CompileOptions(out=tmp_path / "out", tokenizer=str(tiny_model_dir))).run()["totals"]
    assert stats["text_only"] == 2 and stats["samples"] == 0 and stats["retokenized"] == 0
    # … but the teacher's conversation is an expert trace
    out = tmp_path / "traces.jsonl"
    done = subprocess.run(CLI + ["traces", "from-rollouts", "--db", db, "--run", "teacher", "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    row = json.loads(out.read_text())
    assert row["id"] == "pi" and row["provenance"]["model"] == "claude-standin" and row["tools"] == TOOLS
    assert [m["role"] for m in row["expert_trace"]] == ["assistant", "tool", "assistant"]
    assert row["expert_trace"][-1]["content"] == "The answer is <answer>3.14</answer>."


def test_anthropic_teacher_errors_are_the_harness_s_openai_errors(anthropic_upstream, tmp_path):
    url, _ = anthropic_upstream
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, upstream=url, upstream_dialect="anthropic", upstream_api_key="wrong",
                               port=0)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="invalid x-api-key"):
            client.chat.completions.create(model="c", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        with pytest.raises(openai.BadRequestError, match="text parts only"):
            client.chat.completions.create(model="c", max_tokens=5, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    with pytest.raises(UserError, match="token ids"):
        ProxyConfig(db=db, upstream=url, upstream_dialect="anthropic", prefix=True, tokenizer="x").check()


def test_responses_teacher_through_a_second_proxy(tiny_model_dir, tmp_path):
    """An upstream that speaks the Responses API: a harnessrl proxy on the tiny model (its own
    /v1/responses), behind a proxy with --upstream-dialect openai-responses and a key."""
    teacher_db, db = str(tmp_path / "teacher.db"), str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=teacher_db, backend="local", model=str(tiny_model_dir), port=0,
                               api_key=KEY)) as teacher, \
            run_proxy(ProxyConfig(db=db, upstream=teacher.url, upstream_dialect="openai-responses",
                                  upstream_api_key=KEY, port=0)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="harness-own-key", max_retries=0)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is stored under pi?"}]
        reply = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=40,
                                               temperature=0)
        streamed = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                                       temperature=0, stream=True))
    message = reply.choices[0].message
    assert message.content or message.tool_calls
    assert streamed[-1].choices[0].finish_reason in ("stop", "length")
    _, Session = open_db(db)
    with Session() as s:
        assert [(c.status, c.prompt_path) for c in s.scalars(select(Call))] == [("ok", TEXT_ONLY)] * 2
    _, TeacherSession = open_db(teacher_db)
    with TeacherSession() as s:
        seen = s.scalars(select(Call)).all()
    # the teacher saw Responses requests, translated from the harness's chat
    assert [c.request["harnessrl_surface"]["api"] for c in seen] == ["responses"] * 2
    assert seen[0].request["messages"][0] == {"role": "system", "content": "Be brief."}
    assert KEY.encode() not in _db_bytes(db)
