"""Issue 27: a call the proxy refuses before it reaches the model leaves a trace — a failed call row
in its rollout (created on first use), the rollout's `errors`, `/metrics` by surface and status,
an info log line — and a call to a finished rollout costs the harness one request, not a
retry loop (the SDKs retry 409). Real proxy on a socket, the real OpenAI and Anthropic SDKs with
their default retries, a real SQLite file and PostgreSQL."""

from __future__ import annotations

import logging

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, Rollout

MSG = [{"role": "user", "content": "hello"}]


def _metrics(url: str, key: str | None = None) -> dict[tuple, float]:
    resp = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {key}"} if key else {})
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(resp.text) for s in fam.samples}


def _calls_total(surface: str, status: str, endpoint: str = "chat") -> tuple:
    return ("harnessrl_proxy_calls_total", (("endpoint", endpoint), ("status", status), ("surface", surface)))


def _refused(surface: str, http_status: int) -> tuple:
    return ("harnessrl_proxy_refused_total", (("http_status", str(http_status)), ("surface", surface)))


def _db(db: str) -> tuple[list[Call], dict[str, Rollout]]:
    engine, Session = open_db(db)
    with Session() as s:
        calls = list(s.scalars(select(Call).order_by(Call.created_at)))
        rollouts = {r.id: r for r in s.scalars(select(Rollout))}
    engine.dispose()
    return calls, rollouts


def test_refused_calls_are_recorded_counted_and_logged(upstream, db_target, caplog):
    with caplog.at_level(logging.INFO, logger="harnessrl.proxy"), \
            run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0)) as proxy:
        chat = openai.OpenAI(base_url=f"{proxy.url}/r/ro1/a/main/v1", api_key="unused")
        chat.chat.completions.create(model="m", messages=MSG, max_tokens=4)
        with pytest.raises(openai.BadRequestError) as bad_chat:
            # a model name longer than its column: kept cut, not a 500 from the database
            chat.chat.completions.create(model="m" * 300, messages=[{"role": "robot", "content": "x"}])
        with pytest.raises(openai.BadRequestError):  # resolved against the records: an unknown response
            chat.responses.create(model="m", input="x", previous_response_id="resp_" + "0" * 32)
        # a rollout the proxy never saw, named only by its key: created by the refused call itself
        messages = anthropic.Anthropic(base_url=proxy.url, api_key="hrl-ro2-coder")
        with pytest.raises(anthropic.BadRequestError) as bad_msg:
            messages.messages.create(model="m\x00", max_tokens=5, messages=[{"role": "robot", "content": "x"}])
        metrics = _metrics(proxy.url)
    calls, rollouts = _db(db_target)
    assert [(c.rollout_id, c.agent, c.status, c.surface, c.endpoint) for c in calls] == [
        ("ro1", "main", "ok", "chat", "chat"), ("ro1", "main", "error", "chat", "chat"),
        ("ro1", "main", "error", "responses", "chat"), ("ro2", "coder", "error", "messages", "chat")]
    ok, refused_chat, refused_resp, refused_msg = calls
    assert refused_chat.id == bad_chat.value.response.headers["x-harnessrl-call"]
    assert refused_chat.error.startswith("400 invalid_request_error: ") and "messages[0].role" in refused_chat.error
    assert refused_chat.request["messages"] == [{"role": "robot", "content": "x"}]
    assert refused_chat.model == "m" * 256 and len(refused_chat.request["model"]) == 300
    assert refused_resp.error.startswith("400 ") and "resp_" + "0" * 32 in refused_resp.error
    assert refused_msg.error.startswith("400 invalid_request_error: ") and "role" in refused_msg.error
    # the Anthropic body, untranslated (it could not be), under the surface key
    assert refused_msg.request["harnessrl_surface"]["body"]["messages"] == [{"role": "robot", "content": "x"}]
    assert bad_msg.value.response.headers["x-harnessrl-call"] == refused_msg.id
    assert refused_msg.model is None  # a NUL in the name: PostgreSQL text cannot hold it
    assert all(c.response is None and c.prompt_ids is None for c in calls[1:])
    assert ok.client.startswith("OpenAI/Python") and refused_msg.client.startswith("Anthropic/Python")
    assert (rollouts["ro1"].errors, rollouts["ro2"].errors, rollouts["ro2"].status) == (2, 1, "running")
    assert metrics[_calls_total("chat", "ok")] == 1 and metrics[_calls_total("chat", "error")] == 1
    assert metrics[_calls_total("responses", "error")] == 1 and metrics[_calls_total("messages", "error")] == 1
    assert metrics[_refused("chat", 400)] == 1 and metrics[_refused("responses", 400)] == 1
    assert metrics[_refused("messages", 400)] == 1
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and refused_msg.id in r.getMessage()]
    assert len(lines) == 1 and all(w in lines[0] for w in ("messages", "rollout ro2", "error", "400"))


def test_a_finished_rollout_costs_one_request_and_adds_nothing(upstream, tmp_path, caplog):
    db = str(tmp_path / "runs.db")
    with caplog.at_level(logging.INFO, logger="harnessrl.proxy"), \
            run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        rid = httpx.post(proxy.url + "/harnessrl/rollouts", json={"id": "done1"}).json()["id"]
        chat = openai.OpenAI(base_url=f"{proxy.url}/r/{rid}/a/main/v1", api_key="unused")  # default retries
        chat.chat.completions.create(model="m", messages=MSG, max_tokens=4)
        httpx.post(f"{proxy.url}/harnessrl/rollouts/{rid}/finish").raise_for_status()
        with pytest.raises(openai.APIStatusError) as late:
            chat.chat.completions.create(model="m", messages=MSG, max_tokens=4)
        with pytest.raises(anthropic.APIStatusError) as late_msg:
            anthropic.Anthropic(base_url=f"{proxy.url}/r/{rid}/a/main", api_key="unused").messages.create(
                model="m", max_tokens=5, messages=MSG)
        metrics = _metrics(proxy.url)
    assert late.value.status_code == late_msg.value.status_code == 410
    assert late.value.code == "rollout_finished"
    # counted at the server: one request each (a 409 would have been sent 1 + max_retries = 3 times)
    assert metrics[_refused("chat", 410)] == 1 and metrics[_refused("messages", 410)] == 1
    calls, rollouts = _db(db)
    assert [c.status for c in calls] == ["ok"]  # the finished rollout is left as it was
    assert (rollouts[rid].status, rollouts[rid].errors) == ("finished", 0)
    lines = [r.getMessage() for r in caplog.records if "rollout_finished" in r.getMessage()]
    assert len(lines) == 2 and all("rollout done1: error" in x and "410" in x for x in lines)


def test_an_unauthenticated_call_creates_nothing(upstream, tmp_path):
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0, api_key="k")) as proxy:
        chat = openai.OpenAI(base_url=f"{proxy.url}/r/intruder/a/x/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            chat.chat.completions.create(model="m", messages=[{"role": "robot"}])
        bad_id = httpx.post(f"{proxy.url}/r/bad:id/a/x/v1/chat/completions", json={"model": "m", "messages": MSG},
                            headers={"authorization": "Bearer k"})
        metrics = _metrics(proxy.url, "k")
    assert bad_id.status_code == 400 and "x-harnessrl-call" not in bad_id.headers
    assert metrics[_refused("chat", 401)] == 1 and metrics[_refused("chat", 400)] == 1
    assert metrics[_calls_total("chat", "error")] == 2
    calls, rollouts = _db(db)
    assert calls == [] and rollouts == {}


def test_migration_0003_counts_the_failed_calls_already_recorded(db_target):
    """A DB recorded before 0003: its rollouts' `errors` are filled from their failed calls, but a
    call that ended after its rollout was finished (then a 409) is not the harness's error."""
    from sqlalchemy import text

    from harnessrl.db import make_engine, upgrade

    engine = make_engine(db_target)
    upgrade(engine, "0002")
    calls = [("c1", "r1", 0, "ok", None), ("c2", "r1", 1, "error", "400 invalid_request_error: bad"),
             ("c3", "r1", 2, "error", "502 upstream_error: down"), ("c4", "r2", 0, "cancelled", "closed"),
             ("c5", "r3", 0, "error", "409 invalid_request_error: rollout 'r3' is finished")]
    with engine.begin() as conn:
        for rid in ("r1", "r2", "r3"):
            conn.execute(text("INSERT INTO rollouts (id, status, next_seq, created_at) VALUES (:id, 'finished', 3, 0)"),
                         {"id": rid})
        for cid, rid, seq, status, error in calls:
            conn.execute(text("INSERT INTO calls (id, rollout_id, seq, endpoint, stream, request, status, error, "
                              "created_at) VALUES (:id, :rid, :seq, 'chat', false, '{}', :status, :error, 0)"),
                         {"id": cid, "rid": rid, "seq": seq, "status": status, "error": error})
    upgrade(engine)
    with engine.connect() as conn:
        errors = dict(conn.execute(text("SELECT id, errors FROM rollouts")).all())
        surfaces = {row[0] for row in conn.execute(text("SELECT surface FROM calls"))}
    engine.dispose()
    assert errors == {"r1": 2, "r2": 0, "r3": 0} and surfaces == {None}
