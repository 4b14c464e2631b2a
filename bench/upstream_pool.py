"""The proxy's upstream pool on its own: calls/s and CPU per call over plain HTTP and over TLS
(a CA made with trustme) to a minimal uvicorn app, in one run; with `--compare FILE` also an
older copy of it (`proxy/upstream/http_pool.py`, before issue 32 `proxy/httpclient.py`; e.g. from
`git worktree add /tmp/old <rev>`) on plain HTTP, runs interleaved, to check that the plain-HTTP fast path kept its speed.

    python bench/upstream_pool.py [--calls 3000] [--concurrency 32] [--repeats 4] [--compare OLD.py]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import trustme
import uvicorn
import uvloop
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[1]


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _serve(**ssl) -> str:
    async def ok(_request):
        return Response(b'{"ok":true}', media_type="application/json")

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/v1/x", ok, methods=["POST"])]),
                                           log_level="warning", loop="uvloop", http="httptools", **ssl))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return f"{'https' if ssl else 'http'}://127.0.0.1:{sock.getsockname()[1]}"


async def _measure(mod, url: str, calls: int, concurrency: int, ca: str | None) -> tuple[float, float]:
    pool = mod.Pool(url, timeout=30, **({"ca_file": ca} if ca else {}))
    await pool.request("POST", "/v1/x", b"{}")  # connect outside the clock

    async def worker(n: int) -> None:
        for _ in range(n):
            if (await pool.request("POST", "/v1/x", b'{"a": 1}')).status != 200:
                raise RuntimeError("the test server failed")

    t, c = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(calls // concurrency) for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    pool.close()
    return calls / wall, cpu / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--compare", type=Path, help="an older copy of the pool module to run on plain HTTP too")
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp())
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    plain, tls = _serve(), _serve(ssl_certfile=str(d / "cert.pem"), ssl_keyfile=str(d / "key.pem"))
    now = _module(ROOT / "proxy" / "upstream" / "http_pool.py", "pool_now")
    cases = {"plain HTTP": (now, plain, None), "TLS": (now, tls, str(d / "ca.pem"))}
    if args.compare:
        cases["plain HTTP, --compare"] = (_module(args.compare, "pool_old"), plain, None)
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for _ in range(args.repeats):  # interleaved, so drifting load hits every case alike
        for name, (mod, url, ca_file) in cases.items():
            results[name].append(uvloop.run(_measure(mod, url, args.calls, args.concurrency, ca_file)))
    base = sorted(r[0] for r in results["plain HTTP"])[args.repeats // 2]
    print(f"{args.calls} calls, {args.concurrency} concurrent, {args.repeats} interleaved runs; medians "
          "(CPU: this process, client and test server together)")
    for name, rows in results.items():
        rate = sorted(r[0] for r in rows)[args.repeats // 2]
        cpu = sorted(r[1] for r in rows)[args.repeats // 2]
        print(f"  {name:24s} {rate:9,.0f} calls/s  {cpu:6.0f} µs CPU/call  ratio to plain HTTP {rate / base:.2f}")


if __name__ == "__main__":
    main()
