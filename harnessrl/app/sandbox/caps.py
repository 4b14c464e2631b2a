"""The host side of a rollout's resource caps (run.py): a pids cgroup, the output the host
keeps, and the workspace a sandbox hands back.

Processes: RLIMIT_NPROC is not a cap for root (the kernel exempts uid 0, also inside a user
namespace that maps it), so where this process can make a pids cgroup the rollout runs in one of
its own (`pids.max`; its `pids.events` say whether the cap was hit, and every process left in it
is killed at the end, `setsid` or not). Elsewhere the launcher sets RLIMIT_NPROC inside
bubblewrap's user namespace, where the kernel counts that namespace's processes only.

Disk: in a sandbox the rollout's folder (its workspace, HOME, TMPDIR) is a tmpfs of `--disk`
bytes. The launcher copies the host's fresh workspace in, and when the command ends it kills
whatever the command left running and streams the workspace back as a tar over a pipe only it
holds. The host keeps at most a bound of that stream and unpacks it in a second sandbox that can
write the host workspace and nothing else, so no link the agent made is followed on the host.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO

OUTPUT_TAIL = 1 << 16  # bytes of the end of a capped output kept (a summary or a JSON outcome is there)
EXPORT_SLACK = 16 << 20  # tar headers of a workspace of many small files: the stream may outgrow the tmpfs a little


_PIDS_BASE_LOCK = threading.Lock()


def pids_base() -> Path | None:
    """A folder of this process's pids cgroup in which it can make children, or None. Found once
    per process, under a lock: rollouts and known-test runs start on several threads at once."""
    with _PIDS_BASE_LOCK:
        return _find_pids_base()


@functools.cache
def _find_pids_base() -> Path | None:
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields, _, rest = line.partition(" - ")
        fstype, _, options = (rest.split(" ") + ["", "", ""])[:3]
        point = fields.split(" ")[4]
        if fstype == "cgroup" and "pids" in options.split(","):  # v1: its own hierarchy
            path = next((ln.split(":", 2)[2] for ln in own if "pids" in ln.split(":")[1].split(",")), None)
        elif fstype == "cgroup2":  # v2: where pids is delegated to this process's cgroup
            path = next((ln.split(":", 2)[2] for ln in own if ln.startswith("0::")), None)
        else:
            continue
        if path is not None and _can_make(Path(point + path.rstrip("/"))):
            return Path(point + path.rstrip("/"))
    return None


def _can_make(base: Path) -> bool:
    probe = base / f"harnessrl-probe-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        (probe / "pids.max").write_text("16")
        return True
    except OSError:
        return False
    finally:
        probe.rmdir()


def _sweep(base: Path) -> None:
    """Remove the cgroups a killed harnessrl process left (named by its pid; only empty ones go)."""
    for path in base.glob("harnessrl-*-*"):
        pid = path.name.split("-")[1]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            try:
                path.rmdir()
            except OSError:
                pass
        except OSError:
            pass  # alive (someone else's): left alone


class PidsCgroup:
    """One rollout's pids cgroup: `wrap` an argv to start inside it, `close` to empty and remove it."""

    def __init__(self, base: Path, limit: int) -> None:
        _sweep(base)
        self.path = base / f"harnessrl-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(limit))

    def wrap(self, argv: list[str]) -> list[str]:
        # the shell joins the cgroup and becomes the command: nothing runs outside it, not even briefly
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs"), *argv]

    def hit(self) -> bool:
        try:
            events = (self.path / "pids.events").read_text()
        except OSError:
            return False
        return any(int(n) > 0 for n in re.findall(r"^max (\d+)", events, re.MULTILINE))

    def close(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.path.rmdir()
                return
            except OSError:  # its processes are still going
                time.sleep(0.02)


class CappedOutput:
    """Copies a pipe to `out` (or line by line to `on_line`), keeping the first `limit` bytes less
    `OUTPUT_TAIL` and the last `OUTPUT_TAIL`: the host keeps a bounded log however much is written."""

    def __init__(self, pipe: IO[bytes], limit: int | None, out: IO | None = None, on_line=None) -> None:
        self.pipe, self.limit, self.out, self.on_line = pipe, limit, out, on_line
        self.cut = 0  # bytes left out
        self.thread = threading.Thread(target=self._copy, daemon=True)
        self.thread.start()

    def _emit(self, data: bytes) -> None:
        if self.on_line is not None:
            self.on_line(data)
        elif hasattr(self.out, "buffer"):  # a text file: the bytes go under its encoding
            self.out.buffer.write(data)
        else:
            assert self.out is not None
            self.out.write(data)

    def _copy(self) -> None:
        head = max(0, self.limit - OUTPUT_TAIL) if self.limit else None
        kept, tail = 0, bytearray()
        for chunk in iter(self.pipe.readline if self.on_line else lambda: self.pipe.read1(65536), b""):
            if head is None or kept + len(chunk) <= head:
                self._emit(chunk)
                kept += len(chunk)
                continue
            tail += chunk
            if len(tail) > OUTPUT_TAIL:
                drop = len(tail) - OUTPUT_TAIL
                if self.on_line:  # whole lines only
                    drop = tail.find(b"\n", drop) + 1 or len(tail)
                self.cut += drop
                del tail[:drop]
        if self.cut:
            self._emit(f"\n[harnessrl: {self.cut} bytes of output left out (--max-output)]\n".encode())
        for line in (tail.splitlines(keepends=True) if self.on_line else [bytes(tail)] if tail else []):
            self._emit(line)
        if self.out is not None:
            self.out.flush()

    def join(self) -> None:
        self.thread.join(timeout=10)  # a writer the kills did not reach must not hang the host


class Export:
    """The host end of the pipe a sandbox's launcher streams its workspace back over."""

    def __init__(self, limit: int) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.limit = limit + EXPORT_SLACK
        self.header: dict = {}
        self.file = tempfile.TemporaryFile()
        self.truncated = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with os.fdopen(self.read_fd, "rb") as pipe:
            line = pipe.readline(4096)
            try:
                self.header = json.loads(line)
            except ValueError:
                return
            size = 0
            while data := pipe.read(1 << 16):
                if size + len(data) > self.limit:  # more than the tmpfs can have held: drained, not kept
                    self.truncated = True
                    continue
                self.file.write(data)
                size += len(data)

    def started(self) -> None:
        os.close(self.write_fd)  # the sandbox holds the only write end now

    def finish(self, ws: Path, unpack_argv: list[str]) -> dict:
        """Replace the host workspace by what came back (left as it was when nothing did)."""
        self.thread.join(timeout=30)
        try:
            if not self.header:
                return {}
            for child in ws.iterdir():  # the host's own copy: the sandbox only read it
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
            self.file.seek(0)
            subprocess.run(unpack_argv, stdin=self.file, capture_output=True, timeout=120)
            return self.header
        finally:
            self.file.close()


UNPACK = ("import sys, tarfile\n"
          "t = tarfile.open(fileobj=sys.stdin.buffer, mode='r|')\n"
          "kw = {'filter': 'tar'} if hasattr(tarfile, 'tar_filter') else {}  # Pythons before 3.11.4: none\n"
          "for m in t:\n"
          "    try:\n"
          "        t.extract(m, sys.argv[1], set_attrs=not m.isdir(), **kw)\n"
          "    except (OSError, tarfile.TarError):\n"
          "        pass  # what cannot be unpacked in the workspace is left out\n")
