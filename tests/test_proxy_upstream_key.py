"""`--upstream-api-key`: the proxy in front of a vLLM started with `--api-key` (the stand-in with
its key check). The key goes to the upstream on every request — chat, completions, streams,
models, the readiness probe, the prefix-mode token route — and nowhere else: never recorded,
never logged, and the harness's own Authorization header is never forwarded."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import httpx
import openai
import pytest
from sqlalchemy import text

from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.proxy.server import ProxyConfig, run_proxy

UP_KEY = "up-s3cret-key"
HARNESS_KEY = "harness-key"
MSGS = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def keyed_upstream(tokenizer_dir):
    from vllm_standin import create_app, run_standin

    app = create_app(str(tokenizer_dir), api_key=UP_KEY)
    with run_standin(str(tokenizer_dir), app) as url:
        yield url, app.state.auth_seen


def _dump(db: str) -> str:
    engine, _ = open_db(db)
    with engine.connect() as conn:
        out = " ".join(str(row) for t in ("calls", "rollouts", "rewards")
                       for row in conn.execute(text(f"SELECT * FROM {t}")))
    engine.dispose()
    return out


@pytest.mark.parametrize("prefix", [False, True])
def test_the_upstream_key_reaches_the_upstream_and_nothing_else(keyed_upstream, tokenizer_dir, tmp_path, caplog,
                                                                 prefix):
    url, seen = keyed_upstream
    seen.clear()
    db = str(tmp_path / "runs.db")
    cfg = ProxyConfig(db=db, upstream=url, port=0, api_key=HARNESS_KEY, upstream_api_key=UP_KEY, prefix=prefix,
                      tokenizer=str(tokenizer_dir), log_level="debug")
    with caplog.at_level(logging.DEBUG), run_proxy(cfg) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=HARNESS_KEY, max_retries=0)
        assert client.chat.completions.create(model="m", messages=MSGS, max_tokens=4).choices[0].message.content
        assert "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="m", messages=MSGS, max_tokens=4, stream=True) if c.choices)
        assert client.completions.create(model="m", prompt="hi", max_tokens=2).choices[0].text is not None
        assert [m.id for m in client.models.list()] == ["standin"]
        assert httpx.get(proxy.url + "/ready").json()["checks"]["upstream"] == "ok"
    assert seen and set(seen) == {f"Bearer {UP_KEY}"}  # one header, the proxy's own, on every request
    assert UP_KEY not in _dump(db) and HARNESS_KEY not in _dump(db)
    assert UP_KEY not in caplog.text


def test_without_the_key_the_upstream_refuses(keyed_upstream, tmp_path):
    url, _ = keyed_upstream
    with run_proxy(ProxyConfig(db=str(tmp_path / "runs.db"), upstream=url, port=0)) as proxy:
        r = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": MSGS},
                       headers={"authorization": f"Bearer {UP_KEY}"})  # the harness's header is not forwarded
        assert r.status_code == 401
        assert httpx.get(proxy.url + "/ready").status_code == 503


@pytest.mark.unit
@pytest.mark.parametrize("key", ["", "  ", "a b", "k\r\nX-Injected: 1", "ключ"])
def test_a_bad_upstream_key_is_refused_at_start(key):
    with pytest.raises(UserError):
        ProxyConfig(upstream="http://127.0.0.1:1", upstream_api_key=key).check()


def test_an_empty_upstream_key_variable_refuses_to_start(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harnessrl", "proxy", "--upstream", "http://127.0.0.1:1", "--db",
                           str(tmp_path / "r.db")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HARNESSRL_UPSTREAM_API_KEY": ""})
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: the upstream API key is empty") and "Traceback" not in done.stderr
