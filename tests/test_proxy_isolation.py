"""Rollouts are isolated on the Responses surface (issue 30): a stored response is readable
(`GET /v1/responses/{id}`) and continuable (`previous_response_id`, over HTTP and over the
WebSocket) only from its own rollout, whichever way the request names it (the `/r/{rollout}/…`
path, the `x-harnessrl-rollout` header, an `hrl-<rollout>-<agent>` key), or with the proxy's own
key and no rollout named (the operator). From another rollout it is a 404 / 400 exactly like an
id that does not exist: the answer says nothing about whether the id exists elsewhere.
On SQLite and PostgreSQL; the stand-in upstream as a pass-through."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.sync.client import connect

from harnessrl.proxy.server import ProxyConfig, run_proxy

KEY = "sekret"
ASK = {"model": "m", "input": "What is the capital of france?", "max_output_tokens": 8}


@pytest.fixture(params=[None, KEY], ids=["no-key", "key"])
def proxy(request, upstream, db_target):
    with run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0, api_key=request.param)) as p, \
            httpx.Client(base_url=p.url, timeout=30) as http:
        yield p, http, request.param


def _auth(key: str | None, token: str | None = None) -> dict:
    token = token if key is None or token is None else f"{token}:{key}"
    token = token or key
    return {"Authorization": f"Bearer {token}"} if token else {}


def test_a_stored_response_is_read_and_continued_only_from_its_own_rollout(proxy):
    p, http, key = proxy
    made = http.post("/r/ra/a/agent/v1/responses", json=ASK, headers=_auth(key))
    assert made.status_code == 200, made.text
    rid = made.json()["id"]
    missing = "resp_" + "0" * 32

    def get(path: str, headers: dict) -> httpx.Response:
        return http.get(path, headers=headers)

    # its own rollout, named in each of the three ways
    own = [get(f"/r/ra/a/other/v1/responses/{rid}", _auth(key)),
           get(f"/v1/responses/{rid}", {**_auth(key), "x-harnessrl-rollout": "ra"}),
           get(f"/v1/responses/{rid}", _auth(key, "hrl-ra-agent"))]
    assert [r.status_code for r in own] == [200, 200, 200], [r.text for r in own]
    assert all(r.json() == made.json() for r in own)
    # another rollout, named in each way: the same 404 as an id that was never made
    others = [get(f"/r/rb/a/agent/v1/responses/{rid}", _auth(key)),
              get(f"/v1/responses/{rid}", {**_auth(key), "x-harnessrl-rollout": "rb"}),
              get(f"/v1/responses/{rid}", _auth(key, "hrl-rb-agent"))]
    never = get(f"/r/rb/a/agent/v1/responses/{missing}", _auth(key))
    assert [r.status_code for r in others] == [404, 404, 404] and never.status_code == 404
    for r in others:
        assert r.json()["error"] == {**never.json()["error"], "message": never.json()["error"]["message"]
                                     .replace(missing, rid)}
    # no rollout named: the proxy's own key reads any (the operator); without a key it is the
    # `unassigned` rollout, which this response is not in
    bare = get(f"/v1/responses/{rid}", _auth(key))
    assert bare.status_code == (200 if key else 404), bare.text

    # continuing: from its own rollout, not from another
    cont = {**ASK, "previous_response_id": rid, "input": "And of italy?"}
    ok = http.post("/r/ra/a/agent/v1/responses", json=cont, headers=_auth(key))
    assert ok.status_code == 200, ok.text
    for path, headers in ((f"/r/rb/a/agent/v1/responses", _auth(key)),
                          ("/v1/responses", {**_auth(key), "x-harnessrl-rollout": "rb"}),
                          ("/v1/responses", _auth(key, "hrl-rb-agent"))):
        r = http.post(path, json=cont, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found", r.text
    r = http.post("/v1/responses", json=cont, headers=_auth(key))
    assert r.status_code == (200 if key else 400), r.text

    # over the WebSocket: the same rule, for a turn and for a warm-up (generate: false)
    ws_url = p.url.replace("http://", "ws://")
    for path, expect in (("/r/ra/a/agent/v1/responses", "answered"), ("/r/rb/a/agent/v1/responses", "error")):
        for generate in (True, False):
            with connect(ws_url + path, additional_headers=_auth(key)) as ws:
                ws.send(json.dumps({"type": "response.create", "generate": generate, **cont}))
                while True:
                    event = json.loads(ws.recv(timeout=30))
                    if event["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
                        break
            assert (event["type"] if event["type"] == "error" else "answered") == expect, event
            if expect == "error":
                assert event["error"]["code"] == "previous_response_not_found", event
