"""SIGKILL the proxy process mid-load: every call that got a 200 is in the DB."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.records import Call


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigkill_mid_load_loses_no_answered_call(upstream, db_target):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", "from harnessrl.app.cli import main; main()", "proxy",
                             "--upstream", upstream, "--db", db_target, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, "the proxy exited"
            try:
                if httpx.get(url + "/v1/models").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.time() < deadline, "the proxy did not start"
                time.sleep(0.1)
        answered: list[str] = []
        failed = 0

        async def worker(k: int, client: httpx.AsyncClient) -> None:
            nonlocal failed
            for j in range(10_000):
                body = {"model": "m", "messages": [{"role": "user", "content": f"w{k} {j}"}], "stream": j % 3 == 0}
                try:
                    r = await client.post(url + "/v1/chat/completions", json=body)
                except httpx.TransportError:
                    failed += 1
                    return
                if r.status_code == 200 and (not body["stream"] or r.text.endswith("data: [DONE]\n\n")):
                    answered.append(r.headers["x-harnessrl-call"])

        async def killer() -> None:
            while len(answered) < 100:
                await asyncio.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)

        async def main() -> None:
            async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=32)) as client:
                await asyncio.gather(killer(), *(worker(k, client) for k in range(32)))

        asyncio.run(main())
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert failed == 32  # every client was cut off mid-load
    engine, Session = open_db(db_target)
    with Session() as s:
        stored = set(s.scalars(select(Call.id)))
    engine.dispose()
    assert len(answered) >= 100
    assert set(answered) <= stored
