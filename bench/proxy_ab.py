"""Proxy A/B: this checkout's proxy against an earlier commit's, on one stand-in, in alternating
rounds, so that both meet the same machine at the same time.

    python bench/proxy_ab.py --base REV [--rounds 8] [--duration 8] [--clients 64] [--stream]

One round runs the same load (bench/proxy_overhead.py's) through the base proxy, then through
this one (the order alternates). Neither proxy restarts between rounds: each keeps its DB, so a
cost that grows with what has been recorded shows as a trend over the rounds. Prints, per round,
each proxy's recorded calls/s, CPU per call and SQLite WAL size, and the new/old ratios; then
the medians and the range of the ratios. On this shared 2-core machine the same code on both
sides moves ±10–20% from one round to the next, so only a larger effect, or a trend, says much.

The base commit is checked out with `git worktree` into a temporary directory. Its `harnessrl`
package is assembled there with symlinks, following pyproject.toml's package-dir map, and put
first on that proxy's PYTHONPATH. It runs in this checkout's environment, so the base must work
with today's dependencies.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proxy_overhead as po  # noqa: E402
from procs import ROOT, free_port, proxy_cmd, standin_cmd, stop, wait_http, wait_ready  # noqa: E402


def package_tree(tree: Path, into: Path) -> Path:
    """A directory holding `harnessrl` as `tree` lays it out (pyproject.toml's package-dir map:
    `harnessrl.proxy` is `proxy/`, ...), made of symlinks; put it on PYTHONPATH to import it."""
    mapping = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    pkg = into / "harnessrl"
    pkg.mkdir(parents=True)
    for entry in (tree / mapping["harnessrl"]).iterdir():
        (pkg / entry.name).symlink_to(entry)
    for name, folder in mapping.items():
        parts = name.split(".")
        if len(parts) == 2:  # deeper packages lie inside their parent's folder
            (pkg / parts[1]).symlink_to(tree / folder)
    return into


def _proxy(pythonpath: str | None, upstream: str, db: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.Popen(proxy_cmd("--upstream", upstream, "--db", db, "--port", str(port), "--no-ui"),
                            env=env, stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir())


def main() -> None:
    ap = argparse.ArgumentParser(description="this checkout's proxy against REV's, in alternating rounds")
    ap.add_argument("--base", required=True, help="the commit to compare against (any git revision)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per proxy per round")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--stream", action="store_true")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="hrl-ab-"))
    worktree = tmp / "base"
    got = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.base],
                         capture_output=True, text=True)
    if got.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(f"cannot check out {args.base!r}: {got.stderr.strip().splitlines()[-1]}")
    procs: list[subprocess.Popen] = []
    try:
        base_path = str(package_tree(worktree, tmp / "base-pkg"))
        from harnessrl.tiny_model import build_tokenizer

        build_tokenizer().save_pretrained(tmp / "tok")
        up = free_port()
        upstream = subprocess.Popen(standin_cmd(tmp / "tok", up), env={**os.environ, "PYTHONUNBUFFERED": "1"})
        procs.append(upstream)
        sides = {}
        for name, path in (("old", base_path), ("new", None)):
            port, db = free_port(), str(tmp / f"{name}.db")
            proc = _proxy(path, f"http://127.0.0.1:{up}", db, port)
            procs.append(proc)
            sides[name] = (proc, f"http://127.0.0.1:{port}", db)
        wait_http(up, upstream, "stand-in")
        for proc, url, _ in sides.values():
            wait_ready(url, proc)
            po.run_load(url, 4, 1.0, args.stream)  # warm caches and connections
        _run_rounds(args, upstream, sides)
    finally:
        stop(*procs)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _run_rounds(args, upstream: subprocess.Popen, sides: dict) -> None:
    table = Table(title=f"proxy A/B: {args.base} (old) vs this checkout (new), {args.clients} clients, "
                        f"{'streaming' if args.stream else 'non-streaming'}, {args.duration:g} s a side a round")
    for col in ("round", "old calls/s", "new calls/s", "new/old rate", "old CPU µs/call", "new CPU µs/call",
                "new/old CPU", "WAL MB old, new"):
        table.add_column(col, justify="right")
    got: dict[str, list[tuple[float, float, float]]] = {"old": [], "new": []}
    for i in range(args.rounds):
        for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
            proc, url, db = sides[name]
            before = po._count_calls(db)
            t0 = time.perf_counter()
            lat, _, cpu = po._measured(upstream.pid, proc.pid, url, args.clients, args.duration, args.stream)
            elapsed = time.perf_counter() - t0
            got[name].append(((po._count_calls(db) - before) / elapsed, cpu[2] / max(len(lat), 1) * 1e6,
                              po.wal_mb(db)))
        (orate, ocpu, owal), (nrate, ncpu, nwal) = got["old"][-1], got["new"][-1]
        table.add_row(str(i), f"{orate:,.0f}", f"{nrate:,.0f}", f"{nrate / orate:.2f}", f"{ocpu:,.0f}",
                      f"{ncpu:,.0f}", f"{ncpu / ocpu:.2f}", f"{owal:,.0f}, {nwal:,.0f}")
    rates = [n[0] / o[0] for o, n in zip(got["old"], got["new"])]
    cpus = [n[1] / o[1] for o, n in zip(got["old"], got["new"])]
    table.add_row("median", f"{statistics.median(o[0] for o in got['old']):,.0f}",
                  f"{statistics.median(n[0] for n in got['new']):,.0f}", po._spread(rates),
                  f"{statistics.median(o[1] for o in got['old']):,.0f}",
                  f"{statistics.median(n[1] for n in got['new']):,.0f}", po._spread(cpus), "")
    console = Console(width=200)
    console.print(table)
    console.print(f"load average during the run: {os.getloadavg()[0]:.1f} (other processes share these cores)")


if __name__ == "__main__":
    main()
