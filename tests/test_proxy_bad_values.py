"""Values the proxy once took, then failed on (issue 30): each is a client error (an OpenAI-shaped
4xx) on SQLite and PostgreSQL alike, never a 5xx, never stored, and never a 503 that asks the
client to retry a request that can never succeed.

- `seed`: vLLM takes a signed 64-bit integer (its protocol: `torch.iinfo(torch.long)`); the
  proxy refuses anything else with a 400, and the samples of `n`/`best_of` (seed + i) wrap within
  that range rather than leaving it (2^64−1 with n=2 was a 500).
- rollout and reward `metadata`: what the proxy cannot write back as JSON (an integer beyond 64
  bits, nesting deeper than 254) is refused; it was stored, and from then on the rollout list
  answered 500 to everyone. Rows stored by an earlier version are still listed.
- U+0000 in a response id (`GET /v1/responses/resp_%00`, `previous_response_id`): PostgreSQL
  cannot compare text holding it; it was a 503 `database_unavailable` there, a 404 on SQLite.
"""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import update

from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Reward, Rollout

MSGS = [{"role": "user", "content": "Hi"}]
I64_MAX, I64_MIN = 2 ** 63 - 1, -(2 ** 63)


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], r.text
    return err


@pytest.fixture
def http(upstream, db_target):
    with run_proxy(ProxyConfig(db=db_target, upstream=upstream, port=0)) as proxy, \
            httpx.Client(base_url=proxy.url, timeout=30) as client:
        yield client


def test_seed_is_a_signed_64_bit_integer_and_samples_wrap_within_it(upstream, tmp_path):
    with run_proxy(ProxyConfig(db=str(tmp_path / "runs.db"), upstream=upstream, port=0)) as proxy, \
            httpx.Client(base_url=proxy.url, timeout=30) as http:
        for seed in (2 ** 64 - 1, 2 ** 63, I64_MIN - 1, 10 ** 30):
            for extra in ({}, {"n": 2}):
                err = _error(http.post("/v1/chat/completions", json={"model": "m", "messages": MSGS, "seed": seed,
                                                                     **extra}), 400)
                assert err["param"] == "seed", err
            err = _error(http.post("/v1/completions", json={"model": "m", "prompt": "a", "seed": seed, "n": 1,
                                                            "best_of": 2}), 400)
            assert err["param"] == "seed"
        for seed in (I64_MAX, I64_MIN, -1, 0):
            r = http.post("/v1/chat/completions", json={"model": "m", "messages": MSGS, "seed": seed, "n": 3,
                                                        "max_tokens": 2})
            assert r.status_code == 200 and len(r.json()["choices"]) == 3, r.text
            r = http.post("/v1/completions", json={"model": "m", "prompt": "a", "seed": seed, "best_of": 2,
                                                   "max_tokens": 2})
            assert r.status_code == 200, r.text


@pytest.mark.unit
def test_the_samples_seeds_wrap_in_two_s_complement():
    from harnessrl.proxy.fanout import sample_request
    from harnessrl.proxy.protocol import Request

    def seeds(seed: int, k: int) -> list[int]:
        return [sample_request(Request({"seed": seed, "n": k}, None), i).body["seed"] for i in range(k)]

    assert seeds(I64_MAX, 3) == [I64_MAX, I64_MIN, I64_MIN + 1]
    assert seeds(-2, 3) == [-2, -1, 0]
    assert seeds(5, 2) == [5, 6]


def test_metadata_the_proxy_cannot_write_back_is_refused_before_it_is_stored(http):
    deep: object = 1
    for _ in range(600):
        deep = [deep]
    bad = [{"big": 2 ** 64}, {"small": -(2 ** 63) - 1}, {"deep": deep}]
    rid = http.post("/harnessrl/rollouts", json={}).json()["id"]
    for meta in bad:
        wire = json.dumps({"metadata": meta})  # (stdlib json writes what orjson would refuse to)
        for path in ("/harnessrl/rollouts", f"/harnessrl/rollouts/{rid}/reward"):
            body = wire if path.endswith("rollouts") else json.dumps({"value": 1, "metadata": meta})
            err = _error(http.post(path, content=body, headers={"content-type": "application/json"}), 400)
            assert err["param"] == "metadata", err
    edge = {"u64": 2 ** 64 - 1, "i64": -(2 ** 63), "nested": json.loads("[" * 200 + "]" * 200)}
    assert http.post("/harnessrl/rollouts", json={"metadata": edge}).status_code == 200
    listed = http.get("/harnessrl/rollouts")
    assert listed.status_code == 200 and len(listed.json()["data"]) == 2, listed.text
    assert http.get(f"/harnessrl/rollouts/{rid}").status_code == 200


def test_rows_an_earlier_version_stored_are_still_listed(http, db_target):
    """A DB written before the check holds metadata the answers cannot hold: the list and the
    rollout still answer, that one value replaced by a note, and the connection stays usable."""
    good = http.post("/harnessrl/rollouts", json={"task_id": "ok", "metadata": {"a": 1}}).json()["id"]
    bad = http.post("/harnessrl/rollouts", json={"task_id": "bad"}).json()["id"]
    assert http.post(f"/harnessrl/rollouts/{bad}/reward", json={"value": 1}).status_code == 200
    deep: object = 1
    for _ in range(600):
        deep = [deep]
    engine, Session = open_db(db_target)
    with Session.begin() as s:  # what an earlier version let in
        s.execute(update(Rollout).where(Rollout.id == bad).values(meta={"big": 2 ** 64}))
        s.execute(update(Reward).where(Reward.rollout_id == bad).values(meta={"deep": deep}))
    engine.dispose()
    listed = http.get("/harnessrl/rollouts")
    assert listed.status_code == 200, listed.text
    by_id = {r["id"]: r for r in listed.json()["data"]}
    assert by_id[good]["metadata"] == {"a": 1}
    assert set(by_id[bad]["metadata"]) == {"harnessrl_unreadable"}
    one = http.get(f"/harnessrl/rollouts/{bad}")
    assert one.status_code == 200, one.text
    assert set(one.json()["rewards"][0]["metadata"]) == {"harnessrl_unreadable"}
    assert http.get(f"/harnessrl/rollouts/{good}").status_code == 200  # the same keep-alive connection


def test_nul_in_a_response_id_is_not_found_on_every_database(http):
    for rid in ("resp_%00", "resp_a%00b", "%00"):
        err = _error(http.get(f"/v1/responses/{rid}"), 404)
        assert err["code"] == "response_not_found"
    for prev in ("resp_\x00", "resp_" + "a" * 40 + "\x00", "\x00"):
        err = _error(http.post("/v1/responses", json={"model": "m", "input": "hi", "previous_response_id": prev}),
                     400)
        assert err["param"] == "previous_response_id", err
    # other strings a client sends that become text columns: a model name on every surface
    for path, body in (("/v1/chat/completions", {"messages": MSGS}), ("/v1/completions", {"prompt": "a"}),
                       ("/v1/messages", {"messages": MSGS, "max_tokens": 2}), ("/v1/responses", {"input": "hi"}),
                       ("/v1/embeddings", {"input": "hi"})):
        r = http.post(path, json={**body, "model": "m\x00"})
        assert r.status_code == 400, (path, r.text)
    # the same over the Responses WebSocket's warm-up, which reads the records without a model call
    from websockets.sync.client import connect

    url = str(http.base_url).replace("http://", "ws://").rstrip("/") + "/v1/responses"
    with connect(url) as ws:
        ws.send(json.dumps({"type": "response.create", "generate": False, "model": "m", "input": "hi",
                            "previous_response_id": "resp_\x00"}))
        event = json.loads(ws.recv(timeout=30))
    assert event["type"] == "error" and event["status"] == 400, event


def test_an_internal_error_keeps_the_connection_open(upstream, tmp_path):
    """A route that fails unexpectedly is a 500 (logged), and the client's next request on that
    keep-alive connection is still answered: the server used to drop the connection after it."""
    import socket

    from starlette.applications import Starlette
    from starlette.routing import Route

    def boom(_request):
        raise RuntimeError("a bug in a route")

    with run_proxy(ProxyConfig(db=str(tmp_path / "runs.db"), upstream=upstream, port=0)) as proxy:
        proxy.app.api.mount("/boom", Starlette(routes=[Route("/", boom)]))  # stands for any route's bug
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
            answers = []
            for path in ("/boom/", "/v1/models"):
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                data = b""
                while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                answers.append(data.split(b"\r\n", 1)[0])
    assert answers == [b"HTTP/1.1 500 Internal Server Error", b"HTTP/1.1 200 OK"], answers


def _length(response: bytes) -> int:
    head = response.split(b"\r\n\r\n", 1)[0].lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0
