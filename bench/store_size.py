"""Store size: bytes the records DB grows by per recorded call and per recorded token, SQLite and
PostgreSQL, for the proxy benchmark's calls (vLLM stand-in upstream, token ids and log-probs kept).

    python bench/store_size.py [--duration 4] [--pg postgresql+psycopg://postgres@127.0.0.1:5432/test]

Each DB gets the same load (64 clients, half non-streaming, half streaming) through a real proxy;
the growth is measured around the load (SQLite: file + WAL after a checkpoint; PostgreSQL: the
calls and rollouts tables with their indexes and TOAST, in a fresh schema dropped afterwards).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import free_port, proxy_cmd, standin_cmd, stop, wait_http  # noqa: E402
from proxy_overhead import run_load  # noqa: E402


def _size(db: str) -> int:
    if "://" not in db:
        with sqlite3.connect(db) as c:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return sum(Path(p).stat().st_size for p in (db, db + "-wal") if Path(p).exists())
    from sqlalchemy import create_engine, text

    engine = create_engine(db)
    with engine.connect() as c:
        n = c.scalar(text("SELECT pg_total_relation_size('calls') + pg_total_relation_size('rollouts')"))
    engine.dispose()
    return int(n)


def _calls(db: str) -> tuple[int, int]:
    from sqlalchemy import func, select

    from harnessrl.db import open_db
    from harnessrl.records import Call

    engine, Session = open_db(db)
    with Session() as s:
        n, toks = s.execute(select(func.count(), func.sum(Call.prompt_tokens + Call.completion_tokens))).one()
    engine.dispose()
    return int(n or 0), int(toks or 0)


def measure(db: str, tok: Path, duration: float) -> tuple[int, int, int]:
    from harnessrl.db import open_db

    open_db(db)[0].dispose()  # schema first, so its empty size is not counted
    up_port, px_port = free_port(), free_port()
    upstream = subprocess.Popen(standin_cmd(tok, up_port))
    proxy = subprocess.Popen(proxy_cmd("--upstream", f"http://127.0.0.1:{up_port}", "--db", db, "--port", str(px_port)),
                             stderr=subprocess.DEVNULL)
    try:
        wait_http(up_port, upstream, "stand-in")
        wait_http(px_port, proxy, "proxy")
        before = _size(db)
        for stream in (False, True):
            run_load(f"http://127.0.0.1:{px_port}", 64, duration / 2, stream)
    finally:
        stop(proxy, upstream)
    calls, tokens = _calls(db)
    return _size(db) - before, calls, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description="records DB bytes per call and per token")
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
                    help="PostgreSQL server URL (a fresh schema is made there); '' to skip")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hrl-store-"))
    from harnessrl.tiny_model import build_tokenizer

    build_tokenizer().save_pretrained(tmp / "tok")
    targets = [("SQLite", str(tmp / "store.db"))]
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    if args.pg:
        import psycopg

        plain = args.pg.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(plain, autocommit=True) as c:
            c.execute(f"CREATE SCHEMA {schema}")
        targets.append(("PostgreSQL", f"{args.pg}?options=-csearch_path%3D{schema}"))
    try:
        for name, db in targets:
            grown, calls, tokens = measure(db, tmp / "tok", args.duration)
            print(f"{name}: {calls:,} calls, {tokens:,} tokens (prompt + completion), store grew {grown / 1e6:.1f} MB: "
                  f"{grown / max(calls, 1):,.0f} bytes per call, {grown / max(tokens, 1):.1f} bytes per token")
    finally:
        if args.pg:
            with psycopg.connect(plain, autocommit=True) as c:
                c.execute(f"DROP SCHEMA {schema} CASCADE")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
