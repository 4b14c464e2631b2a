"""The cost of routing over several upstreams, and the pause a weight push causes.

    python bench/upstreams.py [--clients 32] [--duration 6] [--sessions 64]

Three vLLM stand-ins and three proxies (`--upstream A`; `--upstream A --upstream A`, the ring's
code path over one upstream; all three), separate processes on this machine; the same load (each
client cycling over `--sessions` session ids) is sent through each proxy in one run. Prints
calls/s recorded, latency p50/p99 and proxy CPU per call, with the ratios to the plain proxy; then a rolling push to the three under load:
how long the push took, the longest a call waited meanwhile, and whether any call was lost.
On a machine with fewer cores than processes the stand-ins compete with the proxy: read the
ratio, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import free_port, proxy_cmd, standin_cmd, stop, wait_http  # noqa: E402
from proxy_overhead import BODY, _count_calls, _cpu_s, _pct  # noqa: E402


async def _load(url: str, clients: int, duration: float, sessions: int) -> tuple[list[float], int]:
    from harnessrl.proxy.upstream.http_pool import Pool

    pool = Pool(url, timeout=60)
    body = orjson.dumps(BODY)
    lat: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + duration

    async def worker(k: int) -> None:
        nonlocal errors
        j = 0
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            headers = {"x-harnessrl-session": f"s{(k + j * clients) % sessions}"}
            j += 1
            try:
                for _ in range(20):  # a 503 during a push says when to retry
                    resp = await pool.request("POST", "/v1/chat/completions", body, headers)
                    if resp.status != 503:
                        break
                    await asyncio.sleep(float(resp.headers.get("retry-after", "1")))
                ok = resp.status == 200
            except Exception:  # noqa: BLE001 - counted
                ok = False
            if ok:
                lat.append(time.perf_counter() - t0)
            else:
                errors += 1

    await asyncio.gather(*(worker(k) for k in range(clients)))
    pool.close()
    return lat, errors


def run_load(url: str, clients: int, duration: float, sessions: int) -> tuple[list[float], int]:
    return asyncio.run(_load(url, clients, duration, sessions))


def main() -> None:
    ap = argparse.ArgumentParser(description="routing over 1 vs 3 upstreams, and a push under load")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=6.0, help="seconds per measurement")
    ap.add_argument("--sessions", type=int, default=64)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="hrl-bench-"))
    from harnessrl.tiny_model import build_tokenizer

    build_tokenizer().save_pretrained(tmp / "tok")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ports = [free_port() for _ in range(3)]
    procs = [subprocess.Popen(standin_cmd(tmp / "tok", p), env=env) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    proxies = {}
    # "1 ring": the first stand-in given twice — the ring's code path with one upstream, which
    # separates the cost of routing from the cost of three stand-ins sharing this machine
    for n, ups in ((1, urls[:1]), ("1 ring", urls[:1] * 2), (3, urls)):
        port, db = free_port(), str(tmp / f"bench{n}.db")
        cmd = proxy_cmd("--db", db, "--port", str(port), "--no-ui", *[a for u in ups for a in ("--upstream", u)])
        proxies[n] = (subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL), f"http://127.0.0.1:{port}", db)
        procs.append(proxies[n][0])
    console = Console(width=140)
    try:
        for p, port in zip(procs[:3], ports):
            wait_http(port, p, "stand-in")
        for n, (p, url, _) in proxies.items():
            wait_http(int(url.rsplit(":", 1)[1]), p, f"proxy ({n} upstreams)")
            run_load(url, 4, 1.0, args.sessions)  # warm connections and caches
        table = Table(title=f"routing cost ({args.clients} clients, {args.sessions} sessions, {os.cpu_count()} cores)")
        for col in ("upstreams", "recorded calls/s", "p50 / p99 ms", "proxy CPU µs/call", "errors"):
            table.add_column(col, justify="right")
        rates = {}
        for n, (p, url, db) in proxies.items():
            before, cpu, t0 = _count_calls(db), _cpu_s(p.pid), time.perf_counter()
            lat, err = run_load(url, args.clients, args.duration, args.sessions)
            elapsed, cpu = time.perf_counter() - t0, _cpu_s(p.pid) - cpu
            rates[n] = (_count_calls(db) - before) / elapsed
            table.add_row(str(n), f"{rates[n]:,.0f}", f"{_pct(lat, .5):.2f} / {_pct(lat, .99):.2f}",
                          f"{cpu / max(len(lat), 1) * 1e6:,.0f}", str(err))
        console.print(table)
        console.print(f"throughput ratio: ring with 1 upstream / plain 1: {rates['1 ring'] / rates[1]:.2f}; "
                      f"3 upstreams / 1: {rates[3] / rates[1]:.2f}")

        # a rolling push to the three while the load runs
        _, url, db = proxies[3]
        before = _count_calls(db)
        result: dict = {}

        async def push_under_load() -> None:
            load = asyncio.create_task(asyncio.to_thread(run_load, url, args.clients, args.duration, args.sessions))
            await asyncio.sleep(args.duration / 3)
            t0 = time.perf_counter()
            async with httpx.AsyncClient(timeout=120) as client:
                r = await client.post(f"{url}/harnessrl/weights", json={"path": str(tmp / "ckpt-v2")})
            result["push_s"], result["status"] = time.perf_counter() - t0, r.status_code
            result["lat"], result["errors"] = await load

        asyncio.run(push_under_load())
        lat = result["lat"]
        console.print(f"rolling push to 3 upstreams under load: HTTP {result['status']} in {result['push_s'] * 1e3:.0f} ms; "
                      f"call latency p50 {_pct(lat, .5):.2f} ms, max {max(lat) * 1e3:.0f} ms; "
                      f"calls answered {len(lat)}, recorded {_count_calls(db) - before}, failed {result['errors']}")
    finally:
        stop(*procs)


if __name__ == "__main__":
    main()
