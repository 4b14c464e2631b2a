"""Running one rollout's command with limits, optionally in a bubblewrap sandbox.

`--sandbox bwrap`: the command sees the whole system read-only, its workspace writable (plus the
few host paths its harness must write, e.g. CODEX_HOME), a private HOME and TMPDIR, its own
process tree (`--unshare-pid`: when the sandbox's first process dies, every process in it dies)
and no network but a relay to the proxy (relay.py): `HostRelay` listens on a unix socket per endpoint (the
proxy, mitmdump), bind-mounted into the sandbox, where `launch.py` listens on 127.0.0.1
at the endpoint's port. Base URLs on 127.0.0.1 therefore work unchanged; any other host or port
is unreachable. Hidden: the other rollouts' workspaces, every `Mounts.hidden` path (the tasks
file's folder, task folders, the loop's output, the records DB; a folder that holds the Python
this runs on is hidden entry by entry around it), harnessrl's cache and the coding family's
generator. `--sandbox none` runs the command in its own process group, killed as a whole on
timeout. Both get per-process memory (RLIMIT_DATA: what a process writes, not the address space
V8 or the JVM reserve), CPU (RLIMIT_CPU) and file-size (RLIMIT_FSIZE) limits, a cap on the
rollout's processes and on the output the host keeps; in a sandbox the workspace, HOME and
TMPDIR share one size-capped tmpfs and /dev/shm is capped too (caps.py).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
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

from harnessrl.app.sandbox.caps import UNPACK, CappedOutput, Export, PidsCgroup, pids_base
from harnessrl.app.sandbox.relay import HostRelay, endpoints_of
from harnessrl.app.sandbox.running import registered
from harnessrl.errors import UserError

SANDBOXES = ("bwrap", "none")
LAUNCH = Path(__file__).with_name("launch.py")
# every rollout's workspace and relay folder lives under here; in a sandbox it is a fresh tmpfs
# holding only this rollout's (and the sandbox's HOME and TMPDIR), so no rollout sees another's
ROOT = Path(tempfile.gettempdir()) / "harnessrl-rollouts"
TIMED_OUT = 124  # the exit code of a command killed at its timeout, as timeout(1) reports it
EXPORT_GRACE = 30.0  # seconds past the timeout the host waits for a launcher to hand its workspace back


@dataclass(frozen=True)
class Limits:
    sandbox: str = "none"  # bwrap | none
    timeout: float | None = None  # seconds of wall time for the whole process tree
    memory: int | None = 8 << 30  # bytes, per process (RLIMIT_DATA)
    cpu_time: int | None = 3600  # CPU seconds, per process (RLIMIT_CPU)
    procs: int | None = 1024  # processes and threads of the whole rollout (a pids cgroup, or RLIMIT_NPROC)
    file_size: int | None = 1 << 30  # bytes, per file written (RLIMIT_FSIZE)
    disk: int | None = 2 << 30  # bytes of the sandbox's workspace + HOME + TMPDIR (a tmpfs), and of /dev/shm
    output: int | None = 4 << 20  # bytes of the command's stdout and stderr the host keeps


@dataclass(frozen=True)
class Mounts:
    workspace: Path  # writable, the command's working directory
    writable: tuple[Path, ...] = ()  # more host paths the command must write (CODEX_HOME, a reward file's folder)
    hidden: tuple[Path, ...] = ()  # host paths whose folders the command must not read (the tasks file, runs.db)
    readable: tuple[Path, ...] = ()  # host paths under ROOT it reads (a {task} file's folder)


@dataclass
class Finished:
    code: int
    timed_out: bool
    seconds: float
    capped: str | None = None  # the cap the command ran into (disk, file-size, procs): the policy's doing, scored
    stopped: bool = False  # killed because nobody needs its result any more (`running.stop_threads`)


def parse_size(text: str, flag: str = "--memory", least: int = 1 << 20) -> int | None:
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
    if value < least:
        raise UserError(f"{flag} {text!r}: at least {least >> 10}K (or 0 for unlimited)")
    return int(value)


def db_files(db: str) -> tuple[Path, ...]:
    """A sqlite records DB's files (the DB and its journals), for `Mounts.hidden`; none for a server's URL."""
    from sqlalchemy.engine import make_url

    from harnessrl.db import db_url

    url = make_url(db_url(db))
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return ()
    path = Path(url.database).resolve()
    return tuple(path.with_name(path.name + end) for end in ("", "-wal", "-shm", "-journal"))


def check_limits(limits: Limits) -> None:
    if limits.sandbox not in SANDBOXES:
        raise UserError(f"--sandbox {limits.sandbox!r}: use {' | '.join(SANDBOXES)}")
    if limits.timeout is not None and limits.timeout <= 0:
        raise UserError("--timeout: a positive number of seconds")
    if limits.cpu_time is not None and limits.cpu_time <= 0:
        raise UserError("--cpu-time: a positive number of seconds (or leave it out)")
    if limits.procs is not None and limits.procs < 16:
        raise UserError(f"--max-procs {limits.procs}: at least 16 (the sandbox's own processes count), or 0: no cap")
    if limits.sandbox == "bwrap":
        _bwrap_works()
        if limits.procs and os.geteuid() == 0 and pids_base() is None:
            raise UserError("--max-procs: as root no process cap can be set here (root ignores RLIMIT_NPROC and no "
                            "pids cgroup can be made); run as another user, or pass --max-procs 0 for no cap")


@functools.cache
def _bwrap_works() -> None:
    """Asked for a sandbox that cannot be had: one line, never a silent run without one."""
    binary = shutil.which("bwrap")
    if binary is None:
        raise UserError("--sandbox bwrap: bubblewrap is not installed (apt-get install bubblewrap), "
                        "or pass --sandbox none to run without a sandbox")
    probe = subprocess.run([binary, *_base_args(), "--size", str(1 << 20), "--tmpfs", "/dev/shm", "--", "/bin/true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[-1]
        raise UserError(f"--sandbox bwrap: bubblewrap cannot make a sandbox here ({why}); allow unprivileged "
                        "user namespaces (sysctl kernel.unprivileged_userns_clone=1) or pass --sandbox none")


def _base_args() -> list[str]:
    return ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent"]


@contextmanager
def relay(limits: Limits, urls: list[str]) -> Iterator[HostRelay | None]:
    """The host side of the relays for a sandboxed rollout (none without a sandbox)."""
    if limits.sandbox != "bwrap":
        yield None
        return
    r = HostRelay(endpoints_of(urls), ROOT)
    try:
        yield r
    finally:
        r.close()


def _keep() -> set[Path]:
    """What a hidden folder may hold that every sandbox runs on: this Python, harnessrl's folders
    (an editable install maps its parts to several), the folders on PATH."""
    import importlib.util

    paths = {sys.prefix, sys.base_prefix, *os.environ.get("PATH", "").split(os.pathsep)}
    paths |= {os.path.dirname(m.__file__) for n, m in list(sys.modules.items())
              if n.split(".")[0] == "harnessrl" and getattr(m, "__file__", None)}
    examples = importlib.util.find_spec("harnessrl.harness_examples")
    paths |= set(examples.submodule_search_locations or []) if examples else set()
    return {Path(p).resolve() for p in paths if p and os.path.isabs(p)}


def private_cache() -> Path:
    """harnessrl's cache (the known tests of tasks, whose node ids name their cases): hidden from every sandbox."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "harnessrl"


@functools.cache
def generator_sources() -> tuple[Path, ...]:
    """The coding family's generator and templates (every template's correct body is in them: with
    a task's docstring they are its reference), their bytecode, and the .git of a source checkout
    that holds them: hidden from every sandbox. The built-in agent needs none of them."""
    import importlib.util

    spec = importlib.util.find_spec("harnessrl.harness_examples.coding")
    if spec is None or not spec.submodule_search_locations:
        return ()
    folder = Path(spec.submodule_search_locations[0]).resolve()
    git = next((p / ".git" for p in folder.parents if (p / ".git").exists()), None)
    return (folder / "tasks.py", folder / "templates.py", folder / "__pycache__", *([git] if git else []))


def hide_args(path: Path, keep: set[Path]) -> list[str]:
    """bwrap arguments that hide `path` (a folder: all of it) but none of `keep`: a folder that
    holds some of them has its other entries hidden one by one, its dot-folders (tool installs
    such as .venv, .local, .nvm) left. Links are left as they are: bwrap would mount at their targets."""
    if not any(k == path or path in k.parents for k in keep):
        if path.is_symlink() or not path.exists():
            return []
        return ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
    if path in keep:
        return []
    args: list[str] = []
    for child in sorted(path.iterdir()):
        if not (child.name.startswith(".") and child.is_dir() and not any(k == child or child in k.parents
                                                                            for k in keep)):
            args += hide_args(child, keep)
    return args


def argv_for(cmd: list[str] | str, limits: Limits, mounts: Mounts, host_relay: HostRelay | None,
             export: Export | None = None) -> list[str]:
    """The full command line: bwrap (if asked), the launcher with limits and relays, the command.
    `export`: the workspace is a copy in the sandbox's size-capped tmpfs, handed back through it."""
    inner = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    launch = [sys.executable, "-I", str(LAUNCH)]
    for flag, value in (("--data", limits.memory), ("--cpu", limits.cpu_time), ("--fsize", limits.file_size)):
        if value:
            launch += [flag, str(value)]
    if limits.sandbox != "bwrap":
        return [*launch, "--", *inner]
    assert host_relay is not None
    home, tmp, ws = host_relay.dir / "home", host_relay.dir / "tmp", mounts.workspace
    size = ["--size", str(limits.disk)] if limits.disk else []
    args = ["bwrap", *_base_args(), *size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    keep = _keep()
    for path in (*mounts.hidden, private_cache(), *generator_sources()):
        args += hide_args(path.resolve(), keep)
    args += [*size, "--tmpfs", str(ROOT)]  # after the hiding: a hidden /tmp must not cover it
    for path in mounts.readable:
        args += ["--ro-bind", str(path), str(path)]
    for path in mounts.writable:
        if path.exists():
            args += ["--bind", str(path), str(path)]
    for port, name in host_relay.sockets:  # the sockets alone: the relay folder is the tmpfs's, like HOME
        args += ["--bind", str(host_relay.dir / name), str(host_relay.dir / name)]
        launch += ["--relay", f"{port}={host_relay.dir / name}"]
    args += ["--dir", str(home), "--dir", str(tmp)]
    if export is not None:
        seed = ws.with_name(ws.name + ".seed")
        args += ["--ro-bind", str(ws), str(seed), "--dir", str(ws)]
        launch += ["--seed", str(seed), "--workspace", str(ws), "--export-fd", str(export.write_fd),
                   "--scan", str(home), "--scan", str(tmp)]
        if limits.timeout:  # the launcher keeps time, so that what a harness left at its timeout comes back
            launch += ["--timeout", str(limits.timeout)]
    else:
        args += ["--bind", str(ws), str(ws)]
    if limits.procs and pids_base() is None:  # RLIMIT_NPROC: counted in bwrap's user namespace only
        launch += ["--nproc", str(limits.procs)]
    args += ["--chdir", str(ws), "--setenv", "HOME", str(home), "--setenv", "TMPDIR", str(tmp)]
    return [*args, "--", *launch, "--", *inner]


def _unpack_argv(ws: Path) -> list[str]:
    """A sandbox that can write the host workspace and nothing else, unpacking a tar from stdin:
    whatever links the agent put in the tar, nothing outside the workspace is written through them."""
    tar = shutil.which("tar")  # GNU tar starts in a few ms, a Python in tens
    unpack = [tar, "-x", "--no-same-owner", "-f", "-", "-C", str(ws)] if tar else [sys.executable, "-I", "-c", UNPACK,
                                                                                   str(ws)]
    return ["bwrap", *_base_args(), "--tmpfs", str(ROOT), "--bind", str(ws), str(ws), "--", *unpack]


def run_limited(cmd: list[str] | str, env: dict[str, str], limits: Limits, mounts: Mounts,
                host_relay: HostRelay | None, stdout: IO | None, on_line=None) -> Finished:
    """Run the command to its end or its timeout (then its whole process tree is killed).
    `on_line`: called with each line of stdout instead of writing it to `stdout`; either way at most
    `limits.output` bytes of it are kept (its start and its end)."""
    copied = limits.sandbox == "bwrap" and ROOT.resolve() in mounts.workspace.resolve().parents  # a fresh copy
    export = Export(limits.disk or 1 << 40) if copied else None
    cgroup = PidsCgroup(pids_base(), limits.procs) if limits.procs and pids_base() is not None else None
    argv = argv_for(cmd, limits, mounts, host_relay, export)
    own_group = limits.sandbox != "bwrap"  # a sandbox's tree dies with its first process
    captured = on_line is not None or stdout is not None
    started = time.perf_counter()
    try:
        proc = subprocess.Popen(cgroup.wrap(argv) if cgroup else argv, env=env, cwd=mounts.workspace,
                                process_group=0 if own_group else None, stdout=subprocess.PIPE if captured else None,
                                stderr=subprocess.STDOUT if stdout is not None else None,
                                pass_fds=(export.write_fd,) if export else ())
    except BaseException:
        if cgroup is not None:
            cgroup.close()
        raise
    if export is not None:
        export.started()
    copier = CappedOutput(proc.stdout, limits.output, stdout, on_line) if captured else None
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

    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        kill()

    # with an export the launcher kills at the timeout and hands the workspace back: this is a backstop
    backstop = EXPORT_GRACE if export is not None else 0.0
    timer = threading.Timer(limits.timeout + backstop, kill) if limits.timeout else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        with registered(stop):
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
        capped = cgroup is not None and cgroup.hit()
        if cgroup is not None:
            cgroup.close()  # and what left the group (setsid) goes with the cgroup
        if copier is not None:
            copier.join()
    header = export.finish(mounts.workspace, _unpack_argv(mounts.workspace)) if export is not None else {}
    hits = (["procs"] if capped else []) + list(header.get("capped") or [])
    if export is not None and export.truncated:
        hits.append("disk")
    code = code if code >= 0 else 128 - code
    if code == 128 + signal.SIGXFSZ:
        hits.append("file-size")
    if stopped.is_set():
        return Finished(code, False, time.perf_counter() - started, stopped=True)
    if fired.is_set() or header.get("timed_out"):
        return Finished(TIMED_OUT, True, time.perf_counter() - started)
    return Finished(code, False, time.perf_counter() - started, hits[0] if hits else None)
