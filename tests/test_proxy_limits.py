"""Bodies off the hot path are bounded too: the API key is checked before a byte of a body is
read (a 256 MiB unauthenticated body once took the proxy from 99 MB to 880 MB before its 401),
one body limit holds for every route, and rollout and reward metadata have a size limit (a
64 MiB metadata was once stored and echoed)."""

from __future__ import annotations

import socket

import httpx
import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Rollout

KEY = "s3cret"
ROUTES = ["/harnessrl/rollouts", "/harnessrl/rollouts/r1/reward", "/harnessrl/calls/c1/reward", "/harnessrl/weights",
          "/v1/chat/completions"]


def _head(port: int, path: str, headers: dict[str, str], first_bytes: bytes = b"") -> bytes:
    """Send a request's head (and `first_bytes` of its body) but never the rest; return the
    status line the proxy answers with. A proxy that waits for the whole body never answers:
    the read times out and the test fails."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        head = f"POST {path} HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        s.sendall(head.encode() + b"\r\n" + first_bytes)
        answer = b""
        while b"\r\n" not in answer:
            got = s.recv(4096)
            if not got:
                break
            answer += got
    return answer.split(b"\r\n", 1)[0]


@pytest.fixture
def proxy(upstream, tmp_path):
    cfg = ProxyConfig(db=str(tmp_path / "runs.db"), upstream=upstream, port=0, api_key=KEY,
                      max_body_bytes=2 * 1024 * 1024)
    with run_proxy(cfg) as p:
        yield p


@pytest.mark.parametrize("path", ROUTES)
def test_a_large_unauthenticated_body_gets_401_before_it_is_sent(proxy, path):
    status = _head(proxy.port, path, {"Content-Length": str(256 * 1024 * 1024)}, b'{"metadata": "' + b"x" * 65536)
    assert status == b"HTTP/1.1 401 Unauthorized"
    chunked = _head(proxy.port, path, {"Transfer-Encoding": "chunked"}, b"10000\r\n" + b"x" * 65536 + b"\r\n")
    assert chunked == b"HTTP/1.1 401 Unauthorized"


@pytest.mark.parametrize("path", ROUTES)
def test_an_over_limit_body_with_the_key_gets_413_on_every_route(proxy, path):
    auth = {"Authorization": f"Bearer {KEY}"}
    assert _head(proxy.port, path, {**auth, "Content-Length": str(3 * 1024 * 1024)}) == \
        b"HTTP/1.1 413 Request Entity Too Large"
    # no Content-Length: counted as it arrives, refused once past the limit
    chunks = (b"x" * 65536 for _ in range(64))
    r = httpx.post(proxy.url + path, content=chunks, headers={**auth, "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_metadata_has_a_size_limit(upstream, tmp_path):
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy, \
            httpx.Client(base_url=proxy.url, timeout=60) as http:
        big = {"blob": "x" * (1024 * 1024)}
        r = http.post("/harnessrl/rollouts", json={"task_id": "t", "metadata": big})
        assert r.status_code == 400 and r.json()["error"]["code"] == "metadata_too_large"
        assert r.json()["error"]["param"] == "metadata" and len(r.content) < 1000  # not echoed
        ok = http.post("/harnessrl/rollouts", json={"task_id": "t", "metadata": {"blob": "x" * 60_000}})
        assert ok.status_code == 200
        rid = ok.json()["id"]
        r = http.post(f"/harnessrl/rollouts/{rid}/reward", json={"value": 1, "metadata": big})
        assert r.status_code == 400 and r.json()["error"]["code"] == "metadata_too_large"
    engine, Session = open_db(db)
    with Session() as s:
        assert [len(m["blob"]) for m in s.scalars(select(Rollout.meta))] == [60_000]
    engine.dispose()
