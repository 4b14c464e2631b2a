"""The fault campaign of issues 12 and 30 in one command: bad-input fuzz, SIGKILL of the proxy under
load (SQLite and PostgreSQL), PostgreSQL connections terminated under load, a long PostgreSQL
outage and a rollout row held locked (bench/fault_db_outage.py), upstream faults — errors, and
answers that end as if complete but are not (an error event mid-stream, a body that is not SSE,
no finish reason, a cut event) in pass-through and `--prefix` mode, on the chat, completions and
Anthropic surfaces —, abandoned streams, and a full disk (a small tmpfs; skipped with the reason
when it cannot be mounted).

    python bench/faults.py [--pg postgresql+psycopg://postgres@127.0.0.1:5432/test] [--fuzz 2000]

Prints per probe: tried, handled well, lost, hangs, upstream errors recorded ok, failed calls
dropped. "Handled well": a 2xx, or an error in the surface's shape (an error event in a stream that
had started) that is a 4xx for a client's mistake and leaves a failed-call record for a call that
reached the model side. "Lost": an acknowledged call missing from the records, a 5xx for a
client's mistake, or a failed call with no record. "Recorded ok": an upstream fault recorded as
a finished call (training would take it for a whole answer). The stand-in, every proxy and the load
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
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_common import HANG_S, MSGS, Probe, openai_error, proxy, recorded  # noqa: E402
from fault_upstream import incomplete_answers, upstream_faults  # noqa: E402
from procs import free_port, standin_cmd, stop, wait_ready  # noqa: E402


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
    proc, url = proxy(upstream, str(tmp / "fuzz.db"), "--prefix", "--tokenizer", str(tmp / "tok"))
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
                ok = r.status_code == 200 or (400 <= r.status_code < 500 and openai_error(r))
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
        proc, url = proxy(upstream, db)
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
        stored = recorded(db)
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
    proc, url = proxy(upstream, db)
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
    stored = recorded(db)
    calls = sum(v for k, v in outcomes.items() if k not in ("slow", "cut", "hang"))
    p.tried = calls + outcomes.get("hang", 0)
    missing = sum(a not in stored for a in answered)
    # a fast 503 (or a stream's error event) while the DB is away is the documented answer
    p.well = outcomes.get("ok", 0) - missing + outcomes.get("503", 0) + outcomes.get("stream-error", 0)
    p.lost = missing + sum(v for k, v in outcomes.items() if k.isdigit() and k != "503")
    p.hangs = outcomes.get("hang", 0)
    p.note = f"{kills[0]} kills; answers: {dict(sorted((k, v) for k, v in outcomes.items() if v))}"
    return p


def db_outage(upstream: str, pg_db: str, tmp: Path) -> Probe:
    from fault_db_outage import db_outage as run

    return _journal_probe("PostgreSQL away 15 s under load, 24 clients", run(upstream, pg_db, tmp / "spill"))


def row_locked(upstream: str, pg_db: str, tmp: Path) -> Probe:
    from fault_db_outage import row_locked as run

    return _journal_probe("a rollout row locked 5 s (lock timeout 1 s), 8 clients",
                          run(upstream, pg_db, tmp / "spill-lock"))


def _journal_probe(name: str, r: dict) -> Probe:
    """A row of bench/fault_db_outage.py's counts: acknowledged and stored, or answered 503 and
    written back from the failed-call journal, is handled well."""
    p = Probe(name, tried=r["made"], lost=r["lost"] + r["5xx"], hangs=r["hangs"], dropped=r["dropped"])
    p.well = r["acknowledged"] - r["lost"] + r["written"]
    p.note = (f"{r['acknowledged']} acknowledged, {r['failed']} failed ({r['written']} written back), "
              f"{r['refused']} refused at a full journal, journal drained in {r['drain_s']:.1f} s")
    return p


def abandoned_streams(upstream: str, tmp: Path, n: int = 20) -> Probe:
    p = Probe("abandoned streams (first chunk read, then hung up)")
    db = str(tmp / "abandon.db")
    proc, url = proxy(upstream, db)
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
    stored = recorded(db)
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
        proc, url = proxy(upstream, db)
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
        stored = recorded(db)
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
            probes.append(db_outage(upstream, _pg_schema(args.pg)[0], tmp))
            probes.append(row_locked(upstream, _pg_schema(args.pg)[0], tmp))
        probes.append(upstream_faults(upstream, tmp))
        probes.append(incomplete_answers(upstream, tmp, "pass-through"))
        probes.append(incomplete_answers(upstream, tmp, "--prefix"))
        probes.append(abandoned_streams(upstream, tmp))
        probes.append(disk_full(upstream, tmp))
    finally:
        standin.kill()
    table = Table(title="fault campaign (issues 12 and 30)")
    counts = ("tried", "handled well", "lost", "hangs", "recorded ok", "dropped")
    for col in ("probe", *counts, "note"):
        table.add_column(col, justify="right" if col in counts else "left")
    for p in probes:
        table.add_row(p.name, str(p.tried), str(p.well), str(p.lost), str(p.hangs),
                      "-" if p.recorded_ok is None else str(p.recorded_ok), "-" if p.dropped is None else str(p.dropped),
                      p.note)
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
