"""The launcher a limited rollout command runs under (inside bubblewrap, or alone with `--sandbox none`).

    python -I launch.py [--data BYTES] [--cpu SECONDS] [--fsize BYTES] [--nproc N]
        [--relay PORT=SOCKET ...] [--seed DIR --workspace DIR --export-fd FD --scan DIR ... [--timeout S]]
        -- ARGV...

It sets the per-process limits (inherited by everything the command starts), listens on
127.0.0.1:PORT for each relay and pipes every connection to the unix SOCKET that the host side
(`relay.HostRelay`) bind-mounted in, runs ARGV and exits with its status. In a sandbox without a
network this is the only way out, and it leads to the proxy alone. With `--export-fd` (only ever
given inside bubblewrap, where it is pid 2 of its own pid namespace) it first copies the read-only
SEED into the size-capped WORKSPACE, and after ARGV ends kills every other process of the
sandbox, then writes to FD a JSON line (the caps that were hit, whether it timed out) and the
workspace as a tar: the host keeps that, never a folder the agent could write. `--timeout`: ARGV
past it is killed with the rest of the sandbox and what it left is handed back all the same, so a
harness that runs past its time is scored on its workspace (issue 54); the host's own timer is a
backstop a little later. Standard library only: it is
run by path with `-I`, not imported.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):  # forwarded as it comes: streamed answers stay streamed
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        conn, _ = listener.accept()
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(path)
        except OSError:
            conn.close()
            up.close()
            continue
        for a, b in ((conn, up), (up, conn)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


def _tasks() -> int:
    """Processes and threads in this pid namespace (what RLIMIT_NPROC counts)."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                n += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                pass
    return n


def _caps_hit(args) -> list[str]:
    """Which caps the command ran into, seen from what it left: a full tmpfs, a file at the size
    cap (a write past it failed: SIGXFSZ is ignored), as many tasks as RLIMIT_NPROC allows."""
    hit = []
    st = os.statvfs(args.workspace)
    if st.f_bavail * st.f_frsize < max(1 << 20, st.f_blocks * st.f_frsize // 100):
        hit.append("disk")
    if args.fsize:
        for top in (args.workspace, *args.scan):
            for folder, _, files in os.walk(top):
                if any(os.lstat(os.path.join(folder, f)).st_size >= args.fsize for f in files):
                    hit.append("file-size")
                    break
            if "file-size" in hit:
                break
    if args.nproc and _tasks() >= args.nproc - 2:
        hit.append("procs")
    return hit


def _export(fd: int, workspace: str, header: dict) -> None:
    with os.fdopen(fd, "wb") as out:
        out.write(json.dumps(header).encode() + b"\n")
        with tarfile.open(fileobj=out, mode="w|") as tar:
            for folder, dirs, files in os.walk(workspace):
                for name in sorted(dirs) + sorted(files):
                    path = os.path.join(folder, name)
                    try:
                        tar.add(path, os.path.relpath(path, workspace), recursive=False)
                    except OSError:
                        pass  # unreadable: not handed back


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sandbox_launch")
    parser.add_argument("--data", type=int, default=0)
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--fsize", type=int, default=0)
    parser.add_argument("--nproc", type=int, default=0)
    parser.add_argument("--relay", action="append", default=[])
    parser.add_argument("--seed")
    parser.add_argument("--workspace")
    parser.add_argument("--export-fd", type=int, default=-1)
    parser.add_argument("--scan", action="append", default=[])
    parser.add_argument("--timeout", type=float, default=0.0)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    exporting = args.export_fd >= 0
    if exporting:
        if os.getpid() != 2:  # kill(-1) below is for a sandbox's own pid namespace only
            print("sandbox_launch: --export-fd outside a pid namespace", file=sys.stderr)
            return 126
        shutil.copytree(args.seed, args.workspace, symlinks=True, dirs_exist_ok=True)
        os.set_inheritable(args.export_fd, False)
        # not dumpable: the command's processes (same uid) cannot open this process's fds in /proc
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    if args.data:
        resource.setrlimit(resource.RLIMIT_DATA, (args.data, args.data))
    if args.cpu:
        resource.setrlimit(resource.RLIMIT_CPU, (args.cpu, args.cpu))
    if args.fsize:
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize, args.fsize))
    if args.nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (args.nproc, args.nproc))
    listeners = []
    for spec in args.relay:
        port, path = spec.split("=", 1)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", int(port)))  # bound before the command starts: its first call finds it
        listener.listen(64)
        listeners.append((listener, path))
    try:
        # SIGXFSZ ignored (set before any thread starts): a write past --fsize fails with EFBIG, the writer lives on
        proc = subprocess.Popen(cmd, preexec_fn=(lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN))
                                if args.fsize else None)
    except OSError as exc:
        print(f"cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    for listener, path in listeners:
        threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    # a SIGTERM for the launcher is meant for the command (the host stops a rollout this way)
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    timed_out = False
    try:
        code = proc.wait(timeout=args.timeout if exporting and args.timeout > 0 else None)
    except subprocess.TimeoutExpired:
        timed_out, code = True, 124  # killed below, with everything else it started
    code = code if code >= 0 else 128 - code
    if exporting:
        hit = _caps_hit(args)
        try:
            os.kill(-1, signal.SIGKILL)  # all the sandbox's other processes: the tree handed back is final
        except ProcessLookupError:
            pass  # there were none
        _export(args.export_fd, args.workspace, {"capped": hit, "timed_out": timed_out})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
