"""Operations (issue 12): `GET /metrics` in the Prometheus text format, and `--log-format json`
with the call id on every line about a call."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import openai
import orjson
from prometheus_client.parser import text_string_to_metric_families

from harnessrl.client import HarnessRL
from harnessrl.proxy.server import ProxyConfig, run_proxy

MSG = [{"role": "user", "content": "hello"}]


def _metrics(url: str, key: str | None = None) -> dict[tuple, float]:
    resp = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {key}"} if key else {})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(resp.text) for s in fam.samples}


def test_metrics_count_calls_latency_commits_and_rollouts(upstream, tmp_path):
    cfg = ProxyConfig(db=str(tmp_path / "r.db"), upstream=upstream, port=0, api_key="k")
    with run_proxy(cfg) as a, run_proxy(cfg) as b:  # two apps in one process: separate registries
        assert httpx.get(a.url + "/metrics").status_code == 401
        before = _metrics(a.url, "k")
        rollouts = [HarnessRL(a.url, api_key="k").create_rollout() for _ in range(3)]
        rollouts[0].finish()
        client = openai.OpenAI(base_url=f"{a.url}/r/{rollouts[1].id}/a/p/v1", api_key="k", max_retries=0)
        for _ in range(2):
            client.chat.completions.create(model="m", messages=MSG, max_tokens=4)
        list(client.chat.completions.create(model="m", messages=MSG, max_tokens=4, stream=True))
        try:
            client.chat.completions.create(model="fail-500", messages=MSG, max_tokens=4)
        except openai.InternalServerError:
            pass
        after = _metrics(a.url, "k")
        wal_bytes = os.path.getsize(tmp_path / "r.db-wal")
        other = _metrics(b.url, "k")
    ok, err = ("harnessrl_proxy_calls_total", (("endpoint", "chat"), ("status", "ok"), ("surface", "chat"))), \
        ("harnessrl_proxy_calls_total", (("endpoint", "chat"), ("status", "error"), ("surface", "chat")))
    assert ok not in before and after[ok] == 3 and after[err] == 1
    assert after[("harnessrl_proxy_call_seconds_count", (("endpoint", "chat"),))] == 4
    assert after[("harnessrl_proxy_upstream_seconds_count", (("endpoint", "chat"),))] == 3  # the failed call has none
    assert after[("harnessrl_proxy_call_seconds_sum", (("endpoint", "chat"),))] > 0
    assert after[("harnessrl_recorder_commit_seconds_count", ())] >= 1
    assert after[("harnessrl_rollouts_running", ())] == 2
    assert after[("harnessrl_recorder_queue", ())] == 0 and after[("harnessrl_db_errors_total", ())] == 0
    assert after[("harnessrl_prefix_index_bytes", ())] > 0  # the chat calls are held for later turns
    assert ok not in other  # proxy B answered no calls
    # the WAL's size, read at scrape time (no checkpoint ran: it takes 400 calls)
    assert after[("harnessrl_sqlite_wal_bytes", ())] == wal_bytes > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_json_log_lines_carry_the_call_id(upstream, tmp_path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "harnessrl", "proxy", "--upstream", upstream, "--db",
                             str(tmp_path / "r.db"), "--port", str(port), "--log-format", "json",
                             "--log-level", "info", "--no-ui"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                httpx.get(url + "/health")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        ok = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 4})
        failed = httpx.post(url + "/v1/chat/completions", json={"model": "fail-500", "messages": MSG})
        assert ok.status_code == 200 and failed.status_code == 500
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    lines = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert lines and len(lines) == len([x for x in err.splitlines() if x.strip()]), err  # every line is JSON
    by_call: dict[str, list[dict]] = {}
    for line in lines:
        assert {"time", "level", "logger", "message"} <= set(line)
        if "call_id" in line:
            by_call.setdefault(line["call_id"], []).append(line)
    for resp in (ok, failed):
        cid = resp.headers["x-harnessrl-call"]
        assert cid in by_call and all(cid in line["message"] for line in by_call[cid])
    assert any(line["level"] == "info" and "error" in line["message"] for line in by_call[failed.headers["x-harnessrl-call"]])
