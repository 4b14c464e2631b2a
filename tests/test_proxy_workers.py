"""`harnessrl proxy --workers N`: several processes on one port and one records DB.

The specification: calls spread over the workers are each recorded once, with every rollout's
`seq` numbers unique and gapless although two processes allocate them; a worker that dies is
replaced and the port keeps answering; SIGINT stops the parent and every worker. Run against a
SQLite file and against PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.proxy.config import ProxyConfig
from harnessrl.records import Call


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(stat.parent.name))
    return out


def _workers_answering(url: str, want: int, tries: int = 300) -> set[int]:
    """The worker pids that /health reports over fresh connections, until `want` are seen."""
    seen: set[int] = set()
    for _ in range(tries):
        try:
            seen.add(httpx.get(url + "/health", timeout=5).json()["worker"])
        except httpx.TransportError:
            time.sleep(0.05)
        if len(seen) >= want:
            break
    return seen


def test_two_workers_share_the_port_and_the_records(upstream, db_target):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-c", "from harnessrl.app.cli import main; main()", "proxy",
                             "--workers", "2", "--upstream", upstream, "--db", db_target, "--port", str(port),
                             "--no-ui"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_children(proc.pid)) < 2 or not _workers_answering(url, 1, 1):
            assert proc.poll() is None, f"the proxy exited: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.2)
        started = time.monotonic()  # the workers are up by now
        workers = _children(proc.pid)
        assert _workers_answering(url, 2) == workers  # both serve, and they are the parent's children

        rollouts = [httpx.post(url + "/harnessrl/rollouts", json={"task_id": f"t{i}"}).json()["id"] for i in range(3)]

        def calls(k: int) -> list[str]:
            ids = []
            with httpx.Client(timeout=30) as client:  # one connection per thread: spread over the workers
                for j in range(10):
                    rid = rollouts[(k + j) % 3]
                    r = client.post(f"{url}/r/{rid}/a/agent/v1/chat/completions",
                                    json={"model": "m", "messages": [{"role": "user", "content": f"{k} {j}"}]})
                    assert r.status_code == 200, r.text
                    ids.append(r.headers["x-harnessrl-call"])
            return ids

        with ThreadPoolExecutor(16) as pool:
            answered = [i for ids in pool.map(calls, range(16)) for i in ids]

        # a worker killed outright is replaced (one that dies within its first seconds would
        # count as failing to start, so wait that long)
        time.sleep(max(0.0, 6.0 - (time.monotonic() - started)))  # workers.py: _EARLY_S = 5
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            # one snapshot per look: two reads could see the victim alive, then as a zombie
            replaced = _children(proc.pid)
            if len(replaced) == 2 and victim not in replaced:
                break
            assert time.monotonic() < deadline, "the killed worker was not replaced"
            time.sleep(0.2)
        assert _workers_answering(url, 2) == replaced
        assert httpx.post(f"{url}/r/{rollouts[0]}/a/agent/v1/chat/completions",
                          json={"model": "m", "messages": [{"role": "user", "content": "after"}]},
                          timeout=30).status_code == 200

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert not [pid for pid in replaced if Path(f"/proc/{pid}").exists()]  # stopped and reaped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    engine, Session = open_db(db_target)
    with Session() as s:
        rows = s.execute(select(Call.id, Call.rollout_id, Call.seq, Call.status)).all()
    engine.dispose()
    assert sorted(r.id for r in rows if r.id in set(answered)) == sorted(answered)  # each answered call, once
    assert len(rows) == len(answered) + 1 and all(r.status == "ok" for r in rows)
    for rid in rollouts:
        seqs = sorted(r.seq for r in rows if r.rollout_id == rid)
        assert seqs == list(range(len(seqs)))  # unique and gapless across the two processes
    assert sum(r.rollout_id in rollouts for r in rows) == len(rows)


@pytest.mark.unit
@pytest.mark.parametrize("bad", [
    {"backend": "local", "model": "m"},
    {"upstreams": ("http://a:1", "http://b:2")},
    {"prefix": True, "tokenizer": "tok"},
    {"workers": 0},
])
def test_workers_refuse_what_they_cannot_share(bad):
    cfg = ProxyConfig(**{"upstream": "http://127.0.0.1:1", "workers": 2, **bad})
    with pytest.raises(UserError, match="--workers"):
        cfg.check()
