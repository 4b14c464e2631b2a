"""One key check for every route (issue 30): with `--api-key K`, `Authorization: Bearer K` and
Anthropic's `x-api-key: K` are taken alike — on the model POSTs, and on /metrics, /v1/models,
`GET /v1/responses/{id}`, count_tokens, the rollout API and the Responses WebSocket (x-api-key was
refused on all of those) — and a missing or wrong key is a 401 on every one of them."""

from __future__ import annotations

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from harnessrl.proxy.server import ProxyConfig, run_proxy

KEY = "sekret"
MSGS = [{"role": "user", "content": "Hi"}]
# (method, path, body): every route a client reaches with a key
ROUTES = [
    ("POST", "/v1/chat/completions", {"model": "m", "messages": MSGS, "max_tokens": 2}),
    ("POST", "/r/ro/a/ag/v1/chat/completions", {"model": "m", "messages": MSGS, "max_tokens": 2}),
    ("POST", "/v1/completions", {"model": "m", "prompt": "a", "max_tokens": 2}),
    ("POST", "/v1/messages", {"model": "m", "messages": MSGS, "max_tokens": 2}),
    ("POST", "/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 2}),
    ("POST", "/v1/messages/count_tokens", {"model": "m", "messages": MSGS}),
    ("GET", "/v1/models", None),
    ("GET", "/r/ro/a/ag/v1/models", None),
    ("GET", "/v1/responses/resp_" + "0" * 32, None),
    ("GET", "/metrics", None),
    ("GET", "/harnessrl/rollouts", None),
    ("POST", "/harnessrl/rollouts", {"task_id": "t"}),
    ("GET", "/harnessrl/rollouts/none", None),
    ("POST", "/harnessrl/rollouts/none/reward", {"value": 1}),
    ("POST", "/harnessrl/rollouts/none/finish", {}),
    ("POST", "/harnessrl/calls/none/reward", {"value": 1}),
    ("POST", "/harnessrl/weights", {"path": "/nowhere"}),
]


@pytest.fixture(scope="module")
def proxy(upstream, tmp_path_factory):
    db = str(tmp_path_factory.mktemp("auth") / "runs.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0, api_key=KEY)) as p, \
            httpx.Client(base_url=p.url, timeout=30) as http:
        yield p, http


@pytest.mark.parametrize("method,path,body", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_route_takes_the_key_in_either_header_and_refuses_a_wrong_one(proxy, method, path, body):
    _, http = proxy
    statuses = {}
    for name, headers in (("bearer", {"Authorization": f"Bearer {KEY}"}), ("x-api-key", {"x-api-key": KEY}),
                          ("none", {}), ("wrong bearer", {"Authorization": "Bearer nope"}),
                          ("wrong x-api-key", {"x-api-key": "nope"})):
        r = http.request(method, path, json=body, headers=headers)
        statuses[name] = r.status_code
        assert r.status_code < 500 or path.endswith("count_tokens"), (name, r.text)  # 501: no tokenizer here
        if r.status_code == 401:  # OpenAI's error shape, or Anthropic's on /v1/messages
            err = r.json()["error"]
            assert err.get("code") == "invalid_api_key" or err["type"] == "authentication_error", r.text
    assert statuses["bearer"] == statuses["x-api-key"] != 401, statuses
    assert statuses["none"] == statuses["wrong bearer"] == statuses["wrong x-api-key"] == 401, statuses


def test_the_responses_websocket_takes_x_api_key_too(proxy):
    p, _ = proxy
    url = p.url.replace("http://", "ws://") + "/v1/responses"
    with connect(url, additional_headers={"x-api-key": KEY}):
        pass
    with pytest.raises(InvalidStatus) as refused:
        with connect(url, additional_headers={"x-api-key": "nope"}):
            pass
    assert refused.value.response.status_code == 401


def test_the_probes_need_no_key(proxy):
    _, http = proxy
    assert http.get("/health").status_code == 200
    assert http.get("/ready").status_code in (200, 503)
