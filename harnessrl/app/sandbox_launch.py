"""The launcher a limited rollout command runs under (inside bubblewrap, or alone with `--sandbox none`).

    python -I sandbox_launch.py [--data BYTES] [--cpu SECONDS] [--relay PORT=SOCKET ...] -- ARGV...

It sets the per-process limits (inherited by everything the command starts), listens on
127.0.0.1:PORT for each relay and pipes every connection to the unix SOCKET that the host side
(`sandbox.HostRelay`) bind-mounted in, runs ARGV and exits with its status. In a sandbox without a
network this is the only way out, and it leads to the proxy alone. Standard library only: it is
run by path with `-I`, not imported.
"""

from __future__ import annotations

import argparse
import resource
import signal
import socket
import subprocess
import sys
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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sandbox_launch")
    parser.add_argument("--data", type=int, default=0)
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--relay", action="append", default=[])
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.data:
        resource.setrlimit(resource.RLIMIT_DATA, (args.data, args.data))
    if args.cpu:
        resource.setrlimit(resource.RLIMIT_CPU, (args.cpu, args.cpu))
    for spec in args.relay:
        port, path = spec.split("=", 1)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", int(port)))  # bound before the command starts: its first call finds it
        listener.listen(64)
        threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    try:
        proc = subprocess.Popen(cmd)
    except OSError as exc:
        print(f"cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    # a SIGTERM for the launcher is meant for the command (the host stops a rollout this way)
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    code = proc.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
