"""Two proxy processes on one PostgreSQL in front of the same three upstreams, the openai SDK
alternating between them (as behind a plain round-robin load balancer): seq allocation,
sticky routing and rollout status stay correct across processes; SIGHUP re-reads the upstream
list."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack

import httpx
import openai
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.proxy.upstream.ring import ring_order
from harnessrl.records import Call
from vllm_standin import create_app, run_standin


def _free_ports(n: int) -> list[int]:
    """n distinct free ports (held open together, so the kernel cannot hand out one twice)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _start(db: str, upstreams_file: str, port: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", "from harnessrl.app.cli import main; main()", "proxy", "--db", db,
                             "--upstreams", upstreams_file, "--port", str(port), "--no-ui"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def _wait_ready(proc: subprocess.Popen, url: str) -> None:
    deadline = time.time() + 120
    while True:
        assert proc.poll() is None, "the proxy exited"
        try:
            if httpx.get(url + "/ready").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.time() < deadline, "the proxy did not start"
        time.sleep(0.1)


def _calls(db: str) -> list[Call]:
    engine, Session = open_db(db)
    with Session() as s:
        rows = list(s.scalars(select(Call).where(Call.rollout_id == "r1").order_by(Call.seq)))
    engine.dispose()
    return rows


def test_two_proxies_on_postgresql_agree_on_seq_routing_and_status(tokenizer_dir, pg_url, tmp_path):
    ups_file = tmp_path / "upstreams.txt"
    with ExitStack() as stack:
        urls = [stack.enter_context(run_standin(str(tokenizer_dir), create_app(str(tokenizer_dir))))
                for _ in range(3)]
        ups_file.write_text("# replicas\n" + "\n".join(urls) + "\n")
        procs = [_start(pg_url, str(ups_file), port) for port in _free_ports(2)]
        for proc, _ in procs:
            stack.callback(proc.wait, 10)
            stack.callback(proc.kill)
        for proc, url in procs:
            _wait_ready(proc, url)
        (a, a_url), (b, b_url) = procs
        httpx.post(f"{a_url}/harnessrl/rollouts", json={"id": "r1"}).raise_for_status()
        sessions = [f"s{i}" for i in range(6)]
        errors: list[BaseException] = []

        def harness(session: str, k: int) -> None:
            try:
                for j in range(4):  # alternate proxies call by call, as a round-robin balancer would
                    url = (a_url, b_url)[(j + k) % 2]
                    client = openai.OpenAI(base_url=f"{url}/r/r1/a/agent/v1", api_key="x", max_retries=0,
                                           default_headers={"x-harnessrl-session": session})
                    client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"{session} {j}"}])
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=harness, args=(s, k)) for k, s in enumerate(sessions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        rows = _calls(pg_url)
        assert [c.seq for c in rows] == list(range(len(sessions) * 4))  # one gap-free sequence, both writers
        for s in sessions:  # both proxies sent the session to the one upstream the ring names
            assert {c.request["harnessrl_upstream"] for c in rows if c.session_id == s} == \
                {ring_order(urls, ("r1", "agent", s))[0]}

        # SIGHUP: proxy A re-reads the list without the third upstream; only its sessions move
        ups_file.write_text("\n".join(urls[:2]) + "\n")
        os.kill(a.pid, signal.SIGHUP)
        deadline = time.time() + 10
        while len(httpx.get(f"{a_url}/ready").json()["upstreams"]) != 2:
            assert time.time() < deadline, "SIGHUP did not re-read the upstream list"
            time.sleep(0.05)
        for s in sessions:
            openai.OpenAI(base_url=f"{a_url}/r/r1/a/agent/v1", api_key="x", max_retries=0,
                          default_headers={"x-harnessrl-session": s}).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "again"}])
        last = {c.session_id: c.request["harnessrl_upstream"] for c in _calls(pg_url)[-len(sessions):]}
        assert last == {s: ring_order(urls[:2], ("r1", "agent", s))[0] for s in sessions}
        assert all(last[s] == ring_order(urls, ("r1", "agent", s))[0] for s in sessions
                   if ring_order(urls, ("r1", "agent", s))[0] != urls[2])

        # finished through B: A, which saw the rollout running, refuses its next call too
        n = len(_calls(pg_url))
        httpx.post(f"{b_url}/harnessrl/rollouts/r1/finish").raise_for_status()
        client = openai.OpenAI(base_url=f"{a_url}/r/r1/a/agent/v1", api_key="x", max_retries=0)
        for _ in range(2):
            try:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "late"}])
                raise AssertionError("a finished rollout took a call")
            except openai.APIStatusError as exc:  # 410: not retried by the SDK
                assert exc.status_code == 410 and exc.code == "rollout_finished"
        assert len([c for c in _calls(pg_url) if c.status == "ok"]) == n
        assert httpx.get(f"{a_url}/harnessrl/rollouts/r1").json()["status"] == "finished"


def test_proxies_starting_together_on_a_fresh_postgresql_all_migrate_it(pg_url):
    """Several proxies started at once on an empty DB each run the migrations: they take turns
    (an advisory lock) instead of failing on each other's tables."""
    errors: list[BaseException] = []

    def start() -> None:
        try:
            open_db(pg_url)[0].dispose()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a migration is stuck behind another"
    assert not errors, errors
