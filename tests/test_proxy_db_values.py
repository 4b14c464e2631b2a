"""What SQLite takes PostgreSQL must take too, or the proxy must refuse it up front: U+0000 in
model output is stored losslessly on both (PostgreSQL text cannot hold it: the call once got a
500 after the upstream had generated, and no record); ids and labels outside their charset or
longer than their column get a clear 400 before any work (task_id > 128 characters once got a
database error)."""

from __future__ import annotations

import httpx
import openai
import pytest
from sqlalchemy import select, text

from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, Reward, Rollout

NUL_TEXT = "before\x00after \uffff0"  # what the stand-in's "nul-output" model answers
MSGS = [{"role": "user", "content": "Say something odd."}]


def _rows(db: str, model, *order):
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(model).order_by(*order)))
        for r in rows:
            s.expunge(r)
    engine.dispose()
    return rows


def test_nul_in_model_output_is_stored_losslessly(upstream, db_target):
    with run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
        chat = client.chat.completions.create(model="nul-output", messages=MSGS)
        done = client.completions.create(model="nul-output", prompt="odd", max_tokens=4)
    assert chat.choices[0].message.content == done.choices[0].text == NUL_TEXT
    calls = _rows(db_target, Call, Call.created_at)
    assert [(c.status, c.response_text) for c in calls] == [("ok", NUL_TEXT), ("ok", NUL_TEXT)]
    assert calls[0].response["choices"][0]["message"]["content"] == NUL_TEXT
    assert calls[1].response["choices"][0]["text"] == NUL_TEXT
    engine, _ = open_db(db_target)
    with engine.connect() as conn:  # what a reader without the ORM type sees: the escaped form
        raw = conn.execute(text("SELECT response_text FROM calls")).scalars().all()
    engine.dispose()
    assert raw == ["before\uffff0after \uffff\uffff0"] * 2


def test_ids_and_labels_are_checked_before_any_work(upstream, db_target):
    with run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0)) as proxy, \
            httpx.Client(base_url=proxy.url, timeout=30) as http:
        ro = http.post("/harnessrl/rollouts", json={"task_id": "t" * 128, "group_id": "round-1-a0/t:7 x",
                                                    "run": "r", "metadata": {"note": "a\x00b"}})
        assert ro.status_code == 200, ro.text
        rid = ro.json()["id"]
        call = http.post(f"/r/{rid}/a/agent/v1/chat/completions", json={"model": "m", "messages": MSGS})
        call_id = call.headers["x-harnessrl-call"]
        cases = [
            (http.post("/harnessrl/rollouts", json={"task_id": "t" * 129}), "value_too_long", "task_id"),
            (http.post("/harnessrl/rollouts", json={"task_id": "a\x00b"}), "invalid_value", "task_id"),
            (http.post("/harnessrl/rollouts", json={"group_id": "g\x00"}), "invalid_value", "group_id"),
            (http.post("/harnessrl/rollouts", json={"run": "r" * 200}), "value_too_long", "run"),
            (http.post(f"/harnessrl/rollouts/{rid}/reward", json={"value": 1, "name": "n" * 65}), "value_too_long",
             "name"),
            (http.post(f"/harnessrl/rollouts/{rid}/reward", json={"value": 1, "name": "n\x00"}), "invalid_value",
             "name"),
            (http.post(f"/harnessrl/calls/{call_id}/reward", json={"value": 1, "name": "\x00"}), "invalid_value",
             "name"),
            (http.post("/harnessrl/rollouts/a%00b/reward", json={"value": 1}), "invalid_identity", None),
            (http.post("/harnessrl/calls/" + "c" * 65 + "/reward", json={"value": 1}), "identity_too_long", None),
            (http.post("/harnessrl/rollouts/a%00b/finish"), "invalid_identity", None),
            (http.get("/harnessrl/rollouts/a%00b"), "invalid_identity", None),
            (http.get("/harnessrl/rollouts", params={"task_id": "a\x00"}), "invalid_value", "task_id"),
            (http.post(f"/harnessrl/rollouts/{rid}/reward", content=b'{"value": 1, "metadata": {"x": NaN}}',
                       headers={"content-type": "application/json"}),
             "invalid_value", "metadata"),
            (http.post("/r/a%00b/a/agent/v1/chat/completions", json={"model": "m", "messages": MSGS}),
             "invalid_identity", None),
            (http.post(f"/r/{rid}/a/ag%00ent/v1/chat/completions", json={"model": "m", "messages": MSGS}),
             "invalid_identity", None),
        ]
        for resp, code, param in cases:
            assert resp.status_code == 400, resp.text
            err = resp.json()["error"]
            assert (err["code"], err["param"]) == (code, param), resp.text
            assert "\x00" not in resp.text and "INSERT" not in resp.text and "SELECT" not in resp.text
        ok = http.post(f"/harnessrl/rollouts/{rid}/reward", json={"value": 1, "name": "n" * 64,
                                                                   "metadata": {"why": "\x00"}})
        assert ok.status_code == 200, ok.text
    (rollout,) = _rows(db_target, Rollout, Rollout.created_at)
    assert (rollout.task_id, rollout.group_id, rollout.meta) == ("t" * 128, "round-1-a0/t:7 x", {"note": "a\x00b"})
    (reward,) = _rows(db_target, Reward, Reward.id)
    assert (reward.name, reward.meta) == ("n" * 64, {"why": "\x00"})
    assert len(_rows(db_target, Call, Call.created_at)) == 1  # refused calls reached neither upstream nor DB


@pytest.mark.unit
def test_the_nul_escape_round_trips():
    from harnessrl.records import escape_nul, unescape_nul

    for s in ["", "plain", "a\x00b", "\uffff", "\uffff0", "\x00\uffff\uffff0\x00", "\uffff\x00", None]:
        assert unescape_nul(escape_nul(s)) == s
        assert escape_nul(s) is None or "\x00" not in escape_nul(s)
    assert escape_nul("plain") == "plain" and unescape_nul("plain") == "plain"
