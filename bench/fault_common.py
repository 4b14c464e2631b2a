"""What the fault probes share (bench/faults.py, bench/fault_upstream.py): a probe's result row,
a proxy process on its own DB, the calls a DB recorded, and the shape of an OpenAI error."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import free_port, wait_ready  # noqa: E402

MSGS = [{"role": "user", "content": "What is the capital of the river country?"}]
HANG_S = 30.0  # a call not answered in this long counts as a hang


@dataclass
class Probe:
    name: str
    tried: int = 0
    well: int = 0
    lost: int = 0
    hangs: int = 0
    recorded_ok: int | None = None  # upstream probes: faults recorded as finished calls
    dropped: int | None = None  # DB outage: failed calls never written
    note: str = ""
    extra: dict = field(default_factory=dict)


def proxy(upstream: str, db: str, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "harnessrl", "proxy", "--upstream", upstream, "--db", db,
                             "--port", str(port), "--no-ui", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return proc, url


def recorded(db: str) -> dict[str, str]:
    """call id -> status of every recorded call."""
    from sqlalchemy import select

    from harnessrl.db import open_db
    from harnessrl.records import Call

    engine, Session = open_db(db)
    with Session() as s:
        out = dict(s.execute(select(Call.id, Call.status)).all())
    engine.dispose()
    return out


def openai_error(r: httpx.Response) -> bool:
    try:
        err = r.json()["error"]
    except Exception:  # noqa: BLE001 - not JSON, not an object, no "error"
        return False
    return isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}


# ---- probes -------------------------------------------------------------------------------
