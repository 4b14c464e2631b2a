"""Running a scorer's command in a fresh sandbox over a clean room, and reading back what it wrote:
shared by the pytest runner (hidden_tests.py) and the data tests (calls.py)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import IO

from harnessrl.app.sandbox.relay import HostRelay
from harnessrl.app.sandbox.run import ROOT, Finished, Limits, Mounts, run_limited


class ScorerFault(Exception):
    """The scorer itself could not run (the test sandbox did not start): an infrastructure fault,
    the rollout's `failed`, never the policy's score. Nothing the agent made raises it."""


def read_tail(f: IO[bytes], n: int) -> str:
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - n))
    return f.read().decode(errors="replace")


def clean_env(home: Path, tmp: Path) -> dict[str, str]:
    """The test run's whole environment: nothing of the rollout's (its key, its base URL) or the host's."""
    return {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "HOME": str(home), "TMPDIR": str(tmp),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def run_sandboxed(cmd: list[str] | str, clean: Path, env: dict[str, str], limits: Limits,
                  hidden: tuple[Path, ...]) -> tuple[Finished, str]:
    """`cmd` in a fresh sandbox over the clean room (a relay with no endpoint: no way out). It
    writes nothing of the host's but the clean room, which is under the disk cap like a workspace."""
    mounts = Mounts(workspace=clean, hidden=hidden)
    host_relay = HostRelay([], ROOT) if limits.sandbox == "bwrap" else None
    try:
        with tempfile.TemporaryFile(dir=ROOT) as out:  # host-side only: ROOT is a fresh tmpfs in a sandbox
            try:
                done = run_limited(cmd, env, limits, mounts, host_relay, out)
            except OSError as exc:  # bubblewrap or Python could not be started: not the agent's doing
                raise ScorerFault(f"the test sandbox could not start: {exc.strerror or exc}") from None
            out.flush()
            return done, read_tail(out, 64 * 1024)
    finally:
        if host_relay is not None:
            host_relay.close()


def read_back(io: Path, name: str, limit: int) -> tuple[bytes | None, str]:
    """A file the test run wrote (at most `limit` + 1 bytes of it), never through a link: the folder
    and the file are the sandbox's to replace. (None, missing | unreadable) when there is none."""
    try:
        folder = os.open(io, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        finally:
            os.close(folder)
    except OSError:
        return None, "missing"
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "unreadable"
        return f.read(limit + 1), "read"
