"""bench/proxy_stages.py --base REV: the stage profile of an earlier commit beside this checkout's,
each in a fresh process, in alternating runs (as bench/proxy_ab.py runs the whole proxy)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
from rich.table import Table

STAGES = Path(__file__).resolve().parent / "proxy_stages.py"
ROOT = STAGES.parents[1]


def _child(upstream: str, clients: int, duration: float, stream: bool, pythonpath: str | None) -> dict:
    """`profile` in a fresh process (of the tree on `pythonpath`, else this checkout's)."""
    env = {**os.environ, **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    out = subprocess.run([sys.executable, str(STAGES), "--upstream", upstream, "--clients", str(clients), "--duration",
                          str(duration), "--json", *(["--stream"] if stream else [])], env=env, capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir())
    return orjson.loads(out.stdout.strip().splitlines()[-1])


def compare(base: str, upstream: str, clients: int, duration: float, rounds: int, tmp: Path,
            stream: bool = False) -> Table:
    """The stages of commit `base` (checked out with `git worktree`, run as `proxy_ab.py` runs it)
    and of this checkout, in alternating rounds; the medians side by side."""
    from proxy_ab import package_tree

    worktree = tmp / "base"
    got = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), base],
                         capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit(f"cannot check out {base!r}: {got.stderr.strip().splitlines()[-1]}")
    try:
        shim = str(package_tree(worktree, tmp / "base-pkg"))
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for i in range(rounds):
            for side in (("before", "after") if i % 2 == 0 else ("after", "before")):
                runs[side].append(_child(upstream, clients, duration, stream, shim if side == "before" else None))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], capture_output=True)
    t = Table(title=f"one recorded call by stage, {base} (before) and this checkout (after): "
                    f"{'streaming' if stream else 'non-streaming'} chat, "
                    f"{clients} client(s), medians of {rounds} alternating runs; CPU µs a call of the event-loop thread")
    for col in ("stage", "before", "after", "after − before"):
        t.add_column(col, justify="right" if col != "stage" else "left")
    rows = [*runs["after"][0]["stages"], "event-loop thread", "recorder's writer thread"]
    for stage in rows:
        key = {"event-loop thread": "loop_us", "recorder's writer thread": "writer_us"}.get(stage)
        b, a = (statistics.median(r[key] if key else r["stages"].get(stage, 0.0) for r in runs[side])
                for side in ("before", "after"))
        t.add_row(stage, f"{b:,.1f}", f"{a:,.1f}", f"{a - b:+,.1f}")
    return t
