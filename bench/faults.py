"""The fault campaign of issue 12 in one command: bad-input fuzz, SIGKILL of the proxy under load
(SQLite and PostgreSQL), PostgreSQL connections terminated under load, upstream faults, abandoned
streams, and a full disk (a small tmpfs; skipped with the reason when it cannot be mounted).

    python bench/faults.py [--pg postgresql+psycopg://postgres@127.0.0.1:5432/test] [--fuzz 2000]

Prints per probe: tried, handled well, lost (and hangs). "Handled well": a 2xx, or an
OpenAI-shaped error that is a 4xx for a client's mistake and leaves a failed-call record for a
call that reached the model side. "Lost": an acknowledged call missing from the records, a 5xx
for a client's mistake, or a failed call with no record. The stand-in, every proxy and the load
generator are separate processes on this machine; a few minutes in all.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import free_port, standin_cmd, stop, wait_ready  # noqa: E402

MSGS = [{"role": "user", "content": "What is the capital of the river country?"}]
HANG_S = 30.0  # a call not answered in this long counts as a hang


@dataclass
class Probe:
    name: str
    tried: int = 0
    well: int = 0
    lost: int = 0
    hangs: int = 0
    note: str = ""
    extra: dict = field(default_factory=dict)


def _proxy(upstream: str, db: str, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "harnessrl", "proxy", "--upstream", upstream, "--db", db,
                             "--port", str(port), "--no-ui", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return proc, url


def _stored(db: str) -> dict[str, str]:
    """call id -> status of every recorded call."""
    from sqlalchemy import select

    from harnessrl.db import open_db
    from harnessrl.records import Call

    engine, Session = open_db(db)
    with Session() as s:
        out = dict(s.execute(select(Call.id, Call.status)).all())
    engine.dispose()
    return out


def _openai_error(r: httpx.Response) -> bool:
    try:
        err = r.json()["error"]
    except Exception:  # noqa: BLE001 - not JSON, not an object, no "error"
        return False
    return isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}


# ---- probes -------------------------------------------------------------------------------
def _mutate(rng: random.Random, body: dict) -> dict:
    odd = [None, True, 0, -1, 2 ** 31, 2.5, "", "a\x00b", [], {}, [1, "x"], {"type": 5}, "[" * 300 + "]" * 300]
    for _ in range(rng.choice([0, 1, 2, 3])):
        nodes: list[tuple] = []

        def walk(node, at=()):
            items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
            for k, v in items:
                nodes.append((*at, k))
                walk(v, (*at, k))

        walk(body)
        path = rng.choice(nodes)
        parent = body
        for k in path[:-1]:
            parent = parent[k]
        if isinstance(parent, dict) and rng.random() < 0.2:
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(odd))
    return body


def fuzz(upstream: str, tmp: Path, n: int) -> Probe:
    p = Probe("bad-input fuzz (chat, sessions with an earlier turn)")
    rng = random.Random(0)
    proc, url = _proxy(upstream, str(tmp / "fuzz.db"), "--prefix", "--tokenizer", str(tmp / "tok"))
    try:
        with httpx.Client(base_url=url, timeout=HANG_S) as http:
            first = http.post("/v1/chat/completions", json={"model": "m", "messages": MSGS, "max_tokens": 4},
                              headers={"x-harnessrl-session": "s"}).json()["choices"][0]["message"]
            for _ in range(n):
                body = {"model": "m", "max_tokens": rng.choice([1, 2, 4]), "temperature": rng.random(),
                        "messages": [*MSGS, first, {"role": "user", "content": "and then?"}]}
                if rng.random() < 0.3:
                    body["tools"] = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
                wire = json.dumps(_mutate(rng, json.loads(json.dumps(body)))).replace('"[[[', "[[[").replace(']]]"', "]]]")
                p.tried += 1
                try:
                    r = http.post("/v1/chat/completions", content=wire, headers={"x-harnessrl-session": "s",
                                                                                 "content-type": "application/json"})
                except httpx.TimeoutException:
                    p.hangs += 1
                    continue
                ok = r.status_code == 200 or (400 <= r.status_code < 500 and _openai_error(r))
                p.well += ok
                p.lost += r.status_code >= 500
    finally:
        stop(proc)
    return p


async def _load(url: str, clients: int, finished, answered: list, outcomes: dict, stream_every: int = 3) -> None:
    async def worker(k: int, client: httpx.AsyncClient) -> None:
        j = 0
        while not finished():
            j += 1
            stream = j % stream_every == 0
            body = {"model": "m", "messages": [{"role": "user", "content": f"w{k} {j}"}], "stream": stream}
            t0 = time.monotonic()
            try:
                r = await client.post(url + "/v1/chat/completions", json=body)
            except httpx.TimeoutException:
                outcomes["hang"] = outcomes.get("hang", 0) + 1
                continue
            except httpx.TransportError:
                outcomes["cut"] = outcomes.get("cut", 0) + 1
                return
            done = r.status_code == 200 and (not stream or r.text.endswith("data: [DONE]\n\n"))
            # a stream that failed after its 200 ends with an OpenAI error event
            key = "ok" if done else "stream-error" if r.status_code == 200 and b'"error"' in r.content else \
                f"{r.status_code}"
            outcomes[key] = outcomes.get(key, 0) + 1
            outcomes["slow"] = outcomes.get("slow", 0) + (time.monotonic() - t0 > 10)
            if done:
                answered.append(r.headers["x-harnessrl-call"])

    async with httpx.AsyncClient(timeout=HANG_S, limits=httpx.Limits(max_connections=clients)) as client:
        await asyncio.gather(*(worker(k, client) for k in range(clients)))


def sigkill(upstream: str, db: str, label: str, kills: int = 2) -> Probe:
    p = Probe(f"SIGKILL under load, 32 clients ({label})")
    for _ in range(kills):
        proc, url = _proxy(upstream, db)
        answered: list[str] = []
        outcomes: dict = {}

        async def run() -> None:
            async def killer() -> None:
                while len(answered) < 200:
                    await asyncio.sleep(0.01)
                os.kill(proc.pid, signal.SIGKILL)

            await asyncio.gather(killer(), _load(url, 32, lambda: proc.poll() is not None, answered, outcomes))

        asyncio.run(run())
        proc.wait(timeout=10)
        stored = _stored(db)
        p.tried += len(answered)
        p.well += sum(a in stored for a in answered)
        p.lost += sum(a not in stored for a in answered)
        p.hangs += outcomes.get("hang", 0)
    p.note = f"{kills} kills; tried = calls acknowledged before the kill"
    return p


def pg_terminate(upstream: str, pg_db: str) -> Probe:
    import psycopg

    p = Probe("PostgreSQL backends terminated under load, 16 clients")
    app_name = f"faults_{uuid.uuid4().hex[:10]}"  # only this proxy's connections are terminated
    db = f"{pg_db}&application_name={app_name}"
    proc, url = _proxy(upstream, db)
    answered: list[str] = []
    outcomes: dict = {}
    kills = [0]
    t_end = time.monotonic() + 6
    try:
        async def run() -> None:
            async def killer() -> None:
                with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True) as c:
                    while time.monotonic() < t_end:
                        await asyncio.sleep(0.7)
                        kills[0] += 1
                        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE application_name = %s", (app_name,))

            await asyncio.gather(killer(), _load(url, 16, lambda: time.monotonic() > t_end, answered, outcomes))

        asyncio.run(run())
    finally:
        stop(proc)
    stored = _stored(db)
    calls = sum(v for k, v in outcomes.items() if k not in ("slow", "cut", "hang"))
    p.tried = calls + outcomes.get("hang", 0)
    missing = sum(a not in stored for a in answered)
    # a fast 503 (or a stream's error event) while the DB is away is the documented answer
    p.well = outcomes.get("ok", 0) - missing + outcomes.get("503", 0) + outcomes.get("stream-error", 0)
    p.lost = missing + sum(v for k, v in outcomes.items() if k.isdigit() and k != "503")
    p.hangs = outcomes.get("hang", 0)
    p.note = f"{kills[0]} kills; answers: {dict(sorted((k, v) for k, v in outcomes.items() if v))}"
    return p


def upstream_faults(upstream: str, tmp: Path) -> Probe:
    p = Probe("upstream faults (500, bad ids/usage/chunk, dead upstream)")
    # the stand-in's fault hooks (tests/vllm_standin.py): what each breaks, streamed or not
    cases = [(upstream, "fail-500", False), (upstream, "fail-500", True), (upstream, "bad-ids", False),
             (upstream, "bad-usage", False), (upstream, "bad-chunk", True)]
    dead = f"http://127.0.0.1:{free_port()}"
    cases += [(dead, "m", False), (dead, "m", True)]
    for target in (upstream, dead):
        db = str(tmp / f"up-{free_port()}.db")
        proc, url = _proxy(target, db)
        ids = []
        try:
            for _ in range(10):
                for t, model, stream in cases:
                    if t != target:
                        continue
                    p.tried += 1
                    try:
                        r = httpx.post(url + "/v1/chat/completions", timeout=HANG_S,
                                       json={"model": model, "messages": MSGS, "stream": stream})
                    except httpx.TimeoutException:
                        p.hangs += 1
                        continue
                    shaped = _openai_error(r) if r.status_code != 200 else b'"error"' in r.content
                    ids.append((r.headers.get("x-harnessrl-call"), shaped))
        finally:
            stop(proc)
        stored = _stored(db)
        for call_id, shaped in ids:
            recorded = stored.get(call_id) == "error"
            p.well += recorded and shaped
            p.lost += not recorded
    return p


def abandoned_streams(upstream: str, tmp: Path, n: int = 20) -> Probe:
    p = Probe("abandoned streams (first chunk read, then hung up)")
    db = str(tmp / "abandon.db")
    proc, url = _proxy(upstream, db)
    ids = []
    try:
        for _ in range(n):
            with httpx.Client(timeout=HANG_S) as http, http.stream(
                    "POST", url + "/v1/chat/completions",
                    json={"model": "m", "messages": MSGS, "stream": True}) as r:
                ids.append(r.headers.get("x-harnessrl-call"))
                next(r.iter_raw())
            p.tried += 1
        time.sleep(2)
    finally:
        stop(proc)
    stored = _stored(db)
    p.well = sum(i in stored for i in ids)
    p.lost = p.tried - p.well
    statuses: dict[str, int] = {}
    for i in ids:
        statuses[stored.get(i, "none")] = statuses.get(stored.get(i, "none"), 0) + 1
    p.note = f"recorded as {statuses}"
    return p


def disk_full(upstream: str, tmp: Path) -> Probe:
    p = Probe("disk full (SQLite on a 4 MiB tmpfs)")
    mnt = tmp / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        p.note = f"skipped: cannot mount a tmpfs ({done.stderr.strip() or done.returncode})"
        return p
    try:
        db = str(mnt / "runs.db")
        proc, url = _proxy(upstream, db)
        answered: list[str] = []
        outcomes: dict = {}
        try:
            with open(mnt / "filler", "wb") as f:  # leave a little room, then none
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            os.truncate(mnt / "filler", max(0, os.path.getsize(mnt / "filler") - 256 * 1024))
            t_end = time.monotonic() + 5
            asyncio.run(_load(url, 8, lambda: time.monotonic() > t_end, answered, outcomes))
        finally:
            stop(proc)
        os.remove(mnt / "filler")
        stored = _stored(db)
        calls = sum(v for k, v in outcomes.items() if k not in ("slow", "cut", "hang"))
        p.tried = calls + outcomes.get("hang", 0)
        p.lost = sum(a not in stored for a in answered)
        # refused with an OpenAI-shaped error (nothing acknowledged that was not stored)
        p.well = outcomes.get("ok", 0) - p.lost + sum(v for k, v in outcomes.items()
                                                      if k in ("500", "503", "stream-error"))
        p.hangs = outcomes.get("hang", 0)
        p.note = f"answers: {dict(sorted((k, v) for k, v in outcomes.items() if v))}"
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    return p


def _pg_schema(pg: str) -> tuple[str, str] | None:
    try:
        import psycopg

        schema = f"faults_{uuid.uuid4().hex[:8]}"
        with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True,
                             connect_timeout=3) as c:
            c.execute(f"CREATE SCHEMA {schema}")
        return f"{pg}?options=-csearch_path%3D{schema}", schema
    except Exception as exc:  # noqa: BLE001 - reported, and the PostgreSQL probes skipped
        print(f"PostgreSQL probes skipped: {exc}")
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--fuzz", type=int, default=2000, help="bad-input requests")
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    from harnessrl.tiny_model import build_tokenizer

    tmp = Path(tempfile.mkdtemp(prefix="harnessrl-faults-"))
    build_tokenizer().save_pretrained(tmp / "tok")
    port = free_port()
    standin = subprocess.Popen(standin_cmd(tmp / "tok", port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    upstream = f"http://127.0.0.1:{port}"
    probes: list[Probe] = []
    try:
        wait_ready(upstream, standin, "/v1/models")
        probes.append(fuzz(upstream, tmp, args.fuzz))
        probes.append(sigkill(upstream, str(tmp / "kill.db"), "SQLite"))
        pg = _pg_schema(args.pg)
        if pg is not None:
            probes.append(sigkill(upstream, pg[0], "PostgreSQL"))
            probes.append(pg_terminate(upstream, _pg_schema(args.pg)[0]))
        probes.append(upstream_faults(upstream, tmp))
        probes.append(abandoned_streams(upstream, tmp))
        probes.append(disk_full(upstream, tmp))
    finally:
        standin.kill()
    table = Table(title="fault campaign (issue 12)")
    for col in ("probe", "tried", "handled well", "lost", "hangs", "note"):
        table.add_column(col, justify="right" if col in ("tried", "handled well", "lost", "hangs") else "left")
    for p in probes:
        table.add_row(p.name, str(p.tried), str(p.well), str(p.lost), str(p.hangs), p.note)
    Console().print(table)


if __name__ == "__main__":
    main()
