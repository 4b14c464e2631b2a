"""An upstream answer that is an error, or that ends without saying it is complete, is a failed
call — recorded `error` with the upstream's words, and answered with an error (an error event in
a stream that had started) — in every mode: pass-through (chat and completions), `--prefix`
(token ids through the upstream's /v1/completions), the Anthropic and Responses surfaces over
them, and the Anthropic / Responses upstream dialects. Issue 30: 32 of 228 upstream-fault cases
were recorded `ok` with a cut text and finish reason "stop" or none."""

from __future__ import annotations

import anthropic
import httpx
import openai
import orjson
import pytest
from raw_upstream import http_response, raw_upstream, sse
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call

FAULTS = ["error-mid-stream", "no-finish", "abort", "non-sse", "garbage", "truncated-json"]
UPSTREAM_WORDS = "injected engine failure mid-stream"  # the stand-in's error event's message


def _rows(db: str) -> dict[str, Call]:
    engine, Session = open_db(db)
    with Session() as s:
        out = {c.id: c for c in s.scalars(select(Call))}
    engine.dispose()
    return out


@pytest.fixture(scope="module")
def proxies(upstream, tokenizer_dir, tmp_path_factory):
    """A pass-through proxy and a --prefix one over the stand-in, each with its own DB."""
    tmp = tmp_path_factory.mktemp("faults")
    plain = ProxyConfig(db=str(tmp / "plain.db"), upstream=upstream, port=0)
    prefix = ProxyConfig(db=str(tmp / "prefix.db"), upstream=upstream, port=0, prefix=True,
                         tokenizer=str(tokenizer_dir))
    with run_proxy(plain) as p, run_proxy(prefix) as q:
        yield {"plain": (p.url, plain.db), "prefix": (q.url, prefix.db)}


def _call(url: str, endpoint: str, fault: str, stream: bool) -> tuple[str, openai.APIError | None, list]:
    """(call id, the error the SDK raised or None, what the stream yielded before it)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    got: list = []
    call_id = None
    try:
        if endpoint == "chat":
            out = client.chat.completions.create(
                model="m", stream=stream, messages=[{"role": "user", "content": f"Say it [fault:{fault}] please"}])
        else:
            out = client.completions.create(model="m", stream=stream, max_tokens=40,
                                            prompt=f"Say it [fault:{fault}] please")
        if stream:
            call_id = out.response.headers["x-harnessrl-call"]
            got.extend(out)
        else:
            call_id = out.id
        return call_id, None, got
    except openai.APIError as exc:
        response = getattr(exc, "response", None)
        return call_id or response.headers["x-harnessrl-call"], exc, got


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("mode", ["plain", "prefix"])
def test_upstream_fault_is_a_failed_call_and_an_error_for_the_harness(proxies, mode, fault, endpoint, stream):
    url, db = proxies[mode]
    call_id, err, got = _call(url, endpoint, fault, stream)
    assert err is not None, f"answered as if complete: {got}"
    (row,) = [r for r in _rows(db).values() if call_id in (r.id, f"chatcmpl-{r.id}", f"cmpl-{r.id}")]
    assert row.status == "error" and row.finish_reason is None, (row.status, row.finish_reason, row.error)
    assert row.error.startswith("502 upstream_error: ")
    if fault == "error-mid-stream":  # the upstream's own words, in the record and for the harness
        assert UPSTREAM_WORDS in row.error and UPSTREAM_WORDS in str(err)
    if fault in ("no-finish", "abort"):
        assert "finish_reason" in row.error and "truncated" in row.error


def test_stream_that_failed_after_its_200_ends_with_an_error_event_not_done(proxies):
    url, db = proxies["plain"]
    r = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": "error-mid-stream", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    events = [e for e in r.text.split("\n\n") if e]
    assert events[0].startswith("data: {") and '"role":"assistant"' in events[0]
    assert b"[DONE]" not in r.content
    last = orjson.loads(events[-1].removeprefix("data: "))
    assert set(last["error"]) == {"message", "type", "param", "code"} and UPSTREAM_WORDS in last["error"]["message"]
    row = _rows(db)[r.headers["x-harnessrl-call"]]
    assert row.status == "error" and UPSTREAM_WORDS in row.error


@pytest.mark.parametrize("mode", ["plain", "prefix"])
def test_anthropic_surface_gets_an_anthropic_error_event(proxies, mode):
    url, db = proxies[mode]
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.APIError, match=UPSTREAM_WORDS):
        with client.messages.stream(model="m", max_tokens=50,
                                    messages=[{"role": "user", "content": "hi [fault:error-mid-stream]"}]) as s:
            list(s)
    r = httpx.post(url + "/v1/messages", timeout=30, headers={"anthropic-version": "2023-06-01"}, json={
        "model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi [fault:no-finish]"}]})
    assert r.status_code == 200 and "message_stop" not in r.text
    kind, data = r.text.strip().split("\n\n")[-1].split("\n")
    assert kind == "event: error" and orjson.loads(data.removeprefix("data: "))["type"] == "error"
    assert _rows(db)[r.headers["x-harnessrl-call"]].status == "error"


def test_responses_surface_ends_with_response_failed(proxies):
    url, db = proxies["plain"]
    r = httpx.post(url + "/v1/responses", timeout=30, json={
        "model": "m", "stream": True, "input": "hi [fault:error-mid-stream]"})
    assert r.status_code == 200
    kinds = [line.removeprefix("event: ") for line in r.text.split("\n") if line.startswith("event: ")]
    assert kinds[-2:] == ["error", "response.failed"] and "response.completed" not in kinds
    row = _rows(db)[r.headers["x-harnessrl-call"]]
    assert row.status == "error" and UPSTREAM_WORDS in row.error


# ---- exact bytes from a raw socket --------------------------------------------------------
def _chunk(content: str | None = None, finish: str | None = None) -> str:
    delta = {} if content is None else {"content": content}
    return orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}).decode()


VLLM_OLD_ERROR = '{"object": "error", "message": "engine dead", "type": "InternalServerError", "code": 500}'


@pytest.mark.parametrize("body, words", [
    (sse(_chunk("The ans"), '{"error": {"message": "engine dead", "type": "InternalServerError", "code": 500}}',
         "[DONE]"), "engine dead"),
    (sse(_chunk("The ans"), VLLM_OLD_ERROR, "[DONE]"), "engine dead"),  # vLLM < 0.9's flat error object
    (sse(_chunk("The ans"), _chunk("wer"), "[DONE]"), "finish_reason"),
    (sse(_chunk("The ans"), _chunk(None, "abort"), "[DONE]"), "'abort'"),  # vLLM: the request was aborted
    (sse(_chunk("The ans")) + b"data: {\"id\": \"c1\", \"choi", "finish_reason"),
], ids=["error-event", "flat-error-event", "no-finish", "abort", "cut-event"])
def test_pass_through_stream_faults_from_exact_bytes(tmp_path, body, words):
    db = str(tmp_path / "runs.db")
    with raw_upstream() as up, run_proxy(ProxyConfig(db=db, upstream=up.url, port=0)) as proxy:
        up.reply = http_response(body)
        r = httpx.post(proxy.url + "/v1/chat/completions", timeout=30, json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert b"[DONE]" not in r.content and b'"error"' in r.content
    row = _rows(db)[r.headers["x-harnessrl-call"]]
    assert row.status == "error" and words in row.error and row.finish_reason is None


def _anthropic_events(stop_reason: str | None, tail: bool = True) -> bytes:
    def ev(kind: str, **data) -> bytes:
        return f"event: {kind}\n".encode() + b"data: " + orjson.dumps({"type": kind, **data}) + b"\n\n"

    out = (ev("message_start", message={"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                                        "model": "claude", "stop_reason": None, "usage": {"input_tokens": 3}})
           + ev("content_block_start", index=0, content_block={"type": "text", "text": ""})
           + ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "The ans"}))
    if tail:
        out += (ev("content_block_stop", index=0)
                + ev("message_delta", delta={"stop_reason": stop_reason}, usage={"output_tokens": 2})
                + ev("message_stop"))
    return out


def _responses_events(status: str) -> bytes:
    final = {"id": "resp_1", "object": "response", "status": status, "output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "The ans"}]}]}
    return (b"event: response.created\ndata: " + orjson.dumps({"type": "response.created", "response": {
        **final, "status": "in_progress", "output": []}}) + b"\n\n"
        + b"event: response.output_text.delta\ndata: " + orjson.dumps(
            {"type": "response.output_text.delta", "output_index": 0, "delta": "The ans"}) + b"\n\n"
        + f"event: response.{status}\n".encode() + b"data: " + orjson.dumps(
            {"type": f"response.{status}", "response": final}) + b"\n\n")


ANTHROPIC_OVERLOADED = b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}'


@pytest.mark.parametrize("dialect, body, whole", [
    ("anthropic", ANTHROPIC_OVERLOADED, None),  # its error as a 200 JSON body, where a stream was asked for
    ("anthropic", _anthropic_events(None, tail=False), None),  # cut before message_delta; a JSON null
    ("anthropic", _anthropic_events(None), {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
                                            "content": [{"type": "text", "text": "The ans"}], "stop_reason": None}),
    ("openai-responses", _responses_events("cancelled"), {"id": "resp_1", "object": "response", "status": "in_progress",
                                                          "output": []}),
], ids=["anthropic-error-as-200", "anthropic-cut", "anthropic-no-stop-reason", "responses-not-completed"])
def test_upstream_dialect_answers_that_never_completed_are_failed_calls(tmp_path, dialect, body, whole):
    db = str(tmp_path / "runs.db")
    with raw_upstream() as up, run_proxy(ProxyConfig(db=db, upstream=up.url, port=0, upstream_dialect=dialect,
                                                     upstream_api_key="k")) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0)
        up.reply = http_response(body)
        with pytest.raises(openai.APIError) as streamed:
            list(client.chat.completions.create(model="m", stream=True, messages=[{"role": "user", "content": "hi"}]))
        if body is ANTHROPIC_OVERLOADED:
            assert "Overloaded" in str(streamed.value)
        up.reply = http_response(orjson.dumps(whole), "application/json")
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert err.value.status_code == 502
    rows = list(_rows(db).values())
    assert [(r.status, r.finish_reason) for r in rows] == [("error", None)] * 2
