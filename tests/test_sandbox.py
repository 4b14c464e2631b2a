"""The per-rollout sandbox (app/sandbox/run.py) on the real bubblewrap: what a command in it can and
cannot reach, write and read, and that a timeout kills its whole process tree."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from harnessrl.app.sandbox.run import ROOT, TIMED_OUT, Limits, Mounts, check_limits, parse_size, relay, run_limited
from harnessrl.errors import UserError

pytestmark = pytest.mark.skipif(not Path("/usr/bin/bwrap").exists(), reason="bubblewrap is not installed")


class Echo:
    """A TCP server on the host's loopback that answers each connection with its name."""

    def __init__(self, name: bytes) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.name = name
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.sendall(self.name + b":" + conn.recv(100))
            conn.close()


@pytest.fixture
def ws() -> Path:
    ROOT.mkdir(parents=True, exist_ok=True)
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="ws-test-", dir=ROOT))
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_the_sandbox_reaches_the_proxy_only_writes_its_workspace_and_cannot_read_hidden_files(ws, tmp_path):
    proxy, other = Echo(b"proxy"), Echo(b"other")
    secret = tmp_path / "tasks.jsonl"
    secret.write_text("the hidden tests")
    hidden_dir = tmp_path / "hidden"
    hidden_dir.mkdir()
    (hidden_dir / "test_x.py").write_text("secret")
    outside = tmp_path / "outside.txt"
    probe = f"""
        import os, socket
        def dial(port):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=3)
                s.sendall(b"hi"); return s.recv(100).decode()
            except OSError as exc:
                return type(exc).__name__
        def can_write(path):
            try:
                open(path, "w").write("x"); return "wrote"
            except OSError as exc:
                return type(exc).__name__
        print("proxy", dial({proxy.port}))
        print("other", dial({other.port}))
        print("outside", can_write({str(outside)!r}))
        print("home", can_write(os.path.join(os.environ["HOME"], "h.txt")))
        print("workspace", can_write("made.txt"))
        try:
            print("secret", repr(open({str(secret)!r}).read()))
        except OSError as exc:
            print("secret", type(exc).__name__)
        print("hidden", os.listdir({str(hidden_dir)!r}))
        print("cwd", os.getcwd())
    """
    limits = Limits(sandbox="bwrap", timeout=30)
    out = tmp_path / "out.txt"
    with relay(limits, [f"http://127.0.0.1:{proxy.port}/v1"]) as host, open(out, "w") as log:
        done = run_limited(_py(probe), dict(os.environ), limits, Mounts(ws, hidden=(secret, hidden_dir)), host, log)
    lines = dict(line.split(" ", 1) for line in out.read_text().splitlines())
    assert done.code == 0 and not done.timed_out, out.read_text()
    assert lines["proxy"] == "proxy:hi"  # through the relay
    assert lines["other"] == "ConnectionRefusedError"  # the host's loopback is not the sandbox's
    assert lines["outside"] == "OSError", lines  # EROFS
    assert not outside.exists()
    assert (lines["home"], lines["workspace"], lines["cwd"]) == ("wrote", "wrote", str(ws))
    assert (ws / "made.txt").read_text() == "x"
    assert (lines["secret"], lines["hidden"]) == ("PermissionError", "[]")  # /dev/null, on a nodev mount


def test_the_sandbox_has_no_network_besides_the_relay(ws, tmp_path):
    """No route anywhere: not even an address outside the machine gets a connection attempt out."""
    code = """
        import socket
        try:
            socket.create_connection(("192.0.2.1", 80), timeout=3)
            print("connected")
        except OSError as exc:
            print(exc.errno)
    """
    limits = Limits(sandbox="bwrap", timeout=30)
    out = tmp_path / "out.txt"
    with relay(limits, []) as host, open(out, "w") as log:
        run_limited(_py(code), dict(os.environ), limits, Mounts(ws), host, log)
    assert out.read_text().strip() == "101"  # ENETUNREACH


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_a_timeout_kills_the_whole_process_tree(sandbox, ws, tmp_path):
    """The command leaves a detached grandchild that would write a file later: the timeout kills
    it too (the sandbox's pid namespace; without one, the process group)."""
    marker = ws / "late.txt"
    code = f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
                                  "import time; time.sleep(3); open({str(marker)!r}, 'w').write('late')"])
        open("child.pid", "w").write(str(child.pid))
        time.sleep(60)
    """
    limits = Limits(sandbox=sandbox, timeout=1.5)
    started = time.perf_counter()
    with relay(limits, []) as host:
        done = run_limited(_py(code), dict(os.environ), limits, Mounts(ws), host, None)
    assert (done.code, done.timed_out) == (TIMED_OUT, True)
    assert time.perf_counter() - started < 10
    time.sleep(3)
    assert not marker.exists()


def test_memory_and_cpu_limits_stop_a_process(ws, tmp_path):
    grab = "b = bytearray(1 << 30); print('allocated')"
    limits = Limits(sandbox="bwrap", timeout=60, memory=256 << 20)
    out = tmp_path / "out.txt"
    with relay(limits, []) as host, open(out, "w") as log:
        done = run_limited([sys.executable, "-c", grab], dict(os.environ), limits, Mounts(ws), host, log)
    assert done.code != 0 and "MemoryError" in out.read_text()
    spin = Limits(sandbox="none", timeout=60, cpu_time=1)
    done = run_limited([sys.executable, "-c", "while True: pass"], dict(os.environ), spin, Mounts(ws), None, None)
    assert done.code == 128 + 9 or done.code == 128 + 24  # SIGXCPU at the soft limit (= the hard one: SIGKILL)
    assert not done.timed_out


def test_bad_limits_are_one_line_errors(monkeypatch):
    with pytest.raises(UserError, match="--sandbox 'docker'"):
        check_limits(Limits(sandbox="docker"))
    with pytest.raises(UserError, match="--timeout"):
        check_limits(Limits(timeout=0))
    for bad in ("lots", "12X", "100"):
        with pytest.raises(UserError, match="--memory"):
            parse_size(bad)
    assert (parse_size("8G"), parse_size("512m"), parse_size("0")) == (8 << 30, 512 << 20, None)


def test_a_sandbox_that_cannot_be_had_is_an_error_not_a_run_without_one(tmp_path):
    """`harnessrl run --sandbox bwrap` where bwrap is not on PATH: one line, exit 2, no rollout made
    (the proxy address is never dialled)."""
    env = {**os.environ, "PATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "harnessrl", "run", "--proxy", "http://127.0.0.1:9",
                           "--no-intercept", "--sandbox", "bwrap", "--", "true"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --sandbox bwrap: bubblewrap is not installed (apt-get install bubblewrap), or pass --sandbox none "
        "to run without a sandbox"]
