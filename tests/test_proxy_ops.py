"""Operations (issue 12, first part): liveness and readiness probes, `--version`, an upstream
given with `/v1`, ids outside the id charset refused before any work, and an empty API key
variable refusing to start."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
import pytest
from sqlalchemy import select

import harnessrl
from harnessrl.client import HarnessRL
from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call

MSG = [{"role": "user", "content": "hello"}]


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harnessrl", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_version():
    done = _cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"harnessrl {harnessrl.__version__}"


def test_an_empty_api_key_variable_refuses_to_start(tmp_path):
    done = _cli("proxy", "--upstream", "http://127.0.0.1:1", "--db", str(tmp_path / "r.db"),
                env={"HARNESSRL_PROXY_API_KEY": ""})
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: the proxy API key is empty") and "Traceback" not in done.stderr


def test_probes_and_an_upstream_given_with_v1(upstream, tmp_path):
    with run_proxy(ProxyConfig(db=str(tmp_path / "r.db"), upstream=upstream + "/v1/", port=0, api_key="k")) as proxy:
        assert httpx.get(proxy.url + "/health").json() == {"status": "ok", "worker": os.getpid()}  # no key needed for probes
        ready = httpx.get(proxy.url + "/ready")
        assert ready.status_code == 200
        assert ready.json() == {"status": "ready", "checks": {"database": "ok", "writer": "ok", "upstream": "ok"}}
        # the /v1 the user gave is not doubled: the call reaches the upstream
        reply = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0).chat.completions.create(
            model="m", messages=MSG, max_tokens=4)
        assert reply.choices[0].message.content is not None


def test_ready_reports_an_unreachable_upstream(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with run_proxy(ProxyConfig(db=str(tmp_path / "r.db"), upstream=dead, port=0)) as proxy:
        assert httpx.get(proxy.url + "/health").status_code == 200  # alive, but
        ready = httpx.get(proxy.url + "/ready")
        assert ready.status_code == 503
        assert ready.json()["status"] == "not_ready" and ready.json()["checks"]["upstream"] == "unreachable"


@pytest.mark.parametrize("where, value", [
    ("key", "hrl-{rid}-agent:s3cret-value"),  # a proxy key sent to a proxy without --api-key
    ("agent", "has space"),
    ("session", "w1;drop"),
    ("agent", "a" * 129),
])
def test_ids_outside_the_charset_are_refused_before_any_work(upstream, tmp_path, where, value):
    db = str(tmp_path / "r.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        rid = HarnessRL(proxy.url).create_rollout().id
        headers, key = {"X-HarnessRL-Rollout": rid}, "unused"
        if where == "key":
            key = value.format(rid=rid)
        else:
            headers[f"X-HarnessRL-{where.capitalize()}"] = value
        r = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": MSG},
                       headers={**headers, "Authorization": f"Bearer {key}"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] in ("invalid_identity", "identity_too_long") and "s3cret" not in r.text
    engine, Session = open_db(db)
    with Session() as s:
        assert s.scalars(select(Call)).all() == []  # refused before the upstream was called
    engine.dispose()
