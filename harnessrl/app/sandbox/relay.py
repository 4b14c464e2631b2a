"""The host side of a sandbox's network: `HostRelay` listens on a unix socket per endpoint (the
proxy, mitmdump), bind-mounted into the sandbox, where `launch.py` listens on 127.0.0.1 at the
endpoint's port and forwards to it; so base URLs on 127.0.0.1 work unchanged and nothing else is
reachable (run.py)."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlsplit

from harnessrl.app.sandbox.launch import pump  # the launcher's own relay loop, so both ends forward alike


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

    def __init__(self, endpoints: list[tuple[str, int]], under: Path) -> None:
        under.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="relay-", dir=under))  # its sockets; in the sandbox also HOME, TMPDIR
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
