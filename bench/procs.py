"""Process plumbing shared by the bench scripts: the command lines of the vLLM stand-in and the
proxy, a free port, waiting for a server to listen or answer, and stopping servers (SIGINT, then
a kill)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def standin_cmd(tokenizer: str | Path, port: int) -> list[str]:
    """The vLLM stand-in (tests/vllm_standin.py) serving `tokenizer` on `port`."""
    return [sys.executable, str(ROOT / "tests" / "vllm_standin.py"), "--tokenizer", str(tokenizer), "--port", str(port)]


def proxy_cmd(*args: str) -> list[str]:
    """`harnessrl proxy ARGS...` run by this interpreter (whatever `harnessrl` PYTHONPATH gives it)."""
    return [sys.executable, "-c", "from harnessrl.app.cli import main; main()", "proxy", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port: int, proc: subprocess.Popen, what: str) -> None:
    """Until `proc` accepts connections on `port` (SystemExit if it dies or takes over 120 s)."""
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} did not start")


def wait_ready(url: str, proc: subprocess.Popen, path: str = "/health") -> None:
    """Until `url + path` answers below 500 (SystemExit if `proc` dies or takes over 120 s)."""
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code < 500:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not start")


def stop(*procs: subprocess.Popen) -> None:
    """SIGINT to all, then wait; a process that does not exit in 15 s is killed."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
