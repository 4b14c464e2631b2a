"""Running one rollout's command with limits, optionally in a bubblewrap sandbox.

`--sandbox bwrap`: the command sees the whole system read-only, its workspace writable (plus the
few host paths its harness must write, e.g. CODEX_HOME), a private HOME and TMPDIR, the other
rollouts' workspaces and the task files (hidden tests, solutions) hidden, its own process tree (`--unshare-pid`: when the sandbox's first process dies, every
process in it dies) and no network but a relay to the proxy: `HostRelay` listens on a unix
socket per endpoint (the proxy, mitmdump), bind-mounted into the sandbox, where
`sandbox_launch.py` listens on 127.0.0.1 at the endpoint's port. Base URLs on 127.0.0.1 therefore
work unchanged; any other host or port is unreachable. `--sandbox none` runs the command in its
own process group, killed as a whole on timeout. Both get per-process memory (RLIMIT_DATA: what a
process writes, not the address space V8 or the JVM reserve) and CPU (RLIMIT_CPU) limits.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from collections.abc import Iterator
from urllib.parse import urlsplit

from harnessrl.app.sandbox_launch import pump  # the launcher's own relay loop, so both ends forward alike
from harnessrl.errors import UserError

SANDBOXES = ("bwrap", "none")
LAUNCH = Path(__file__).with_name("sandbox_launch.py")
# every rollout's workspace and relay folder lives under here; in a sandbox it is a fresh tmpfs
# holding only this rollout's (and the sandbox's HOME and TMPDIR), so no rollout sees another's
ROOT = Path(tempfile.gettempdir()) / "harnessrl-rollouts"
TIMED_OUT = 124  # the exit code of a command killed at its timeout, as timeout(1) reports it


@dataclass(frozen=True)
class Limits:
    sandbox: str = "none"  # bwrap | none
    timeout: float | None = None  # seconds of wall time for the whole process tree
    memory: int | None = 8 << 30  # bytes, per process (RLIMIT_DATA)
    cpu_time: int | None = 3600  # CPU seconds, per process (RLIMIT_CPU)


@dataclass(frozen=True)
class Mounts:
    workspace: Path  # writable, the command's working directory
    writable: tuple[Path, ...] = ()  # more host paths the command must write (CODEX_HOME, a reward file's folder)
    hidden: tuple[Path, ...] = ()  # host paths the command must not read (the tasks file, hidden tests)
    readable: tuple[Path, ...] = ()  # host paths under ROOT it reads (a {task} file's folder)


@dataclass
class Finished:
    code: int
    timed_out: bool
    seconds: float


def parse_size(text: str, flag: str = "--memory") -> int | None:
    """`8G`, `512M`, `1048576`; `0` or `none`: unlimited."""
    t = text.strip().lower()
    if t in ("0", "none"):
        return None
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    scale = units.get(t[-1:], 1)
    try:
        value = float(t[:-1] if t[-1:] in units else t) * scale
    except ValueError:
        raise UserError(f"{flag} {text!r}: a size such as 8G, 512M or 0 (unlimited)") from None
    if value < 1 << 20:
        raise UserError(f"{flag} {text!r}: at least 1M (or 0 for unlimited)")
    return int(value)


def check_limits(limits: Limits) -> None:
    if limits.sandbox not in SANDBOXES:
        raise UserError(f"--sandbox {limits.sandbox!r}: use {' | '.join(SANDBOXES)}")
    if limits.timeout is not None and limits.timeout <= 0:
        raise UserError("--timeout: a positive number of seconds")
    if limits.cpu_time is not None and limits.cpu_time <= 0:
        raise UserError("--cpu-time: a positive number of seconds (or leave it out)")
    if limits.sandbox == "bwrap":
        _bwrap_works()


@functools.cache
def _bwrap_works() -> None:
    """Asked for a sandbox that cannot be had: one line, never a silent run without one."""
    binary = shutil.which("bwrap")
    if binary is None:
        raise UserError("--sandbox bwrap: bubblewrap is not installed (apt-get install bubblewrap), "
                        "or pass --sandbox none to run without a sandbox")
    probe = subprocess.run([binary, *_base_args(), "--", "/bin/true"], capture_output=True, text=True)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[-1]
        raise UserError(f"--sandbox bwrap: bubblewrap cannot make a sandbox here ({why}); allow unprivileged "
                        "user namespaces (sysctl kernel.unprivileged_userns_clone=1) or pass --sandbox none")


def _base_args() -> list[str]:
    return ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent"]


def endpoints_of(urls: list[str]) -> list[tuple[str, int]]:
    """The (host, port) of each http URL, for the relays."""
    out = []
    for url in urls:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if (parts.hostname or "", port) not in out:
            out.append((parts.hostname or "127.0.0.1", port))
    return out


def local_url(url: str) -> str:
    """The URL as the sandbox reaches it: the relay listens on 127.0.0.1 at the same port."""
    parts = urlsplit(url)
    if parts.hostname in (None, "127.0.0.1"):
        return url
    port = parts.port or (443 if parts.scheme == "https" else 80)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host).geturl()


class HostRelay:
    """Unix sockets in a fresh folder, each piping its connections to one TCP endpoint."""

    def __init__(self, endpoints: list[tuple[str, int]]) -> None:
        ROOT.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="relay-", dir=ROOT))
        for private in ("home", "tmp"):  # the sandbox's HOME and TMPDIR
            (self.dir / private).mkdir()
        self.sockets: list[tuple[int, str]] = []  # (port the sandbox dials, socket name)
        self._listeners: list[socket.socket] = []
        for i, (host, port) in enumerate(endpoints):
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(self.dir / f"{i}.sock"))
            listener.listen(64)
            self._listeners.append(listener)
            self.sockets.append((port, f"{i}.sock"))
            threading.Thread(target=self._serve, args=(listener, host, port), daemon=True).start()

    @staticmethod
    def _serve(listener: socket.socket, host: str, port: int) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the rollout is over
                return
            try:
                up = socket.create_connection((host, port), timeout=30)
                up.settimeout(None)
            except OSError:
                conn.close()
                continue
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        for listener in self._listeners:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def relay(limits: Limits, urls: list[str]) -> Iterator[HostRelay | None]:
    """The host side of the relays for a sandboxed rollout (none without a sandbox)."""
    if limits.sandbox != "bwrap":
        yield None
        return
    r = HostRelay(endpoints_of(urls))
    try:
        yield r
    finally:
        r.close()


def argv_for(cmd: list[str] | str, limits: Limits, mounts: Mounts, host_relay: HostRelay | None) -> list[str]:
    """The full command line: bwrap (if asked), the launcher with limits and relays, the command."""
    inner = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    launch = [sys.executable, "-I", str(LAUNCH)]
    if limits.memory:
        launch += ["--data", str(limits.memory)]
    if limits.cpu_time:
        launch += ["--cpu", str(limits.cpu_time)]
    if limits.sandbox != "bwrap":
        return [*launch, "--", *inner]
    assert host_relay is not None
    home, tmp = host_relay.dir / "home", host_relay.dir / "tmp"
    args = ["bwrap", *_base_args(), "--tmpfs", str(ROOT)]
    for path in mounts.hidden:
        if path.is_dir():
            args += ["--tmpfs", str(path)]
        elif path.exists():
            args += ["--ro-bind", "/dev/null", str(path)]
    for path in mounts.readable:
        args += ["--ro-bind", str(path), str(path)]
    for path in (*mounts.writable, mounts.workspace, host_relay.dir):
        if path.exists():
            args += ["--bind", str(path), str(path)]
    args += ["--chdir", str(mounts.workspace), "--setenv", "HOME", str(home), "--setenv", "TMPDIR", str(tmp)]
    for port, name in host_relay.sockets:
        launch += ["--relay", f"{port}={host_relay.dir / name}"]
    return [*args, "--", *launch, "--", *inner]


def run_limited(cmd: list[str] | str, env: dict[str, str], limits: Limits, mounts: Mounts,
                host_relay: HostRelay | None, stdout: IO | None, on_line=None) -> Finished:
    """Run the command to its end or its timeout (then its whole process tree is killed).
    `on_line`: called with each line of stdout instead of writing it to `stdout`."""
    argv = argv_for(cmd, limits, mounts, host_relay)
    own_group = limits.sandbox != "bwrap"  # a sandbox's tree dies with its first process
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=mounts.workspace, process_group=0 if own_group else None,
                            stdout=subprocess.PIPE if on_line else stdout,
                            stderr=subprocess.STDOUT if stdout is not None else None)
    fired = threading.Event()

    def kill() -> None:
        fired.set()
        try:
            if own_group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except ProcessLookupError:
            pass

    timer = threading.Timer(limits.timeout, kill) if limits.timeout else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        if on_line is not None:
            assert proc.stdout is not None
            for line in proc.stdout:
                on_line(line)
        code = proc.wait()
    except BaseException:
        kill()  # interrupted: the rollout's processes go with it
        proc.wait()
        raise
    finally:
        if timer is not None:
            timer.cancel()
    if own_group:
        try:  # the leader is gone; what it left behind in its group goes too
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if fired.is_set():
        return Finished(TIMED_OUT, True, time.perf_counter() - started)
    return Finished(code if code >= 0 else 128 - code, False, time.perf_counter() - started)
