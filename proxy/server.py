"""Running the proxy: `serve(cfg)` for the CLI, `run_proxy(cfg)` in-process (tests, demo, the
training loop) — uvicorn (uvloop + httptools) on a real socket in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn

from harnessrl.errors import UserError
from harnessrl.proxy.config import ProxyConfig

__all__ = ["ProxyConfig", "RunningProxy", "run_proxy", "serve", "build_app"]


def load_backend(cfg: ProxyConfig):
    """The local token backend for backend="local" (None for upstreams)."""
    if cfg.backend != "local":
        return None
    from pathlib import Path

    from harnessrl.proxy.local.backend import LocalBackend

    if not Path(cfg.model or "").is_dir():
        raise UserError(f"--model must be a checkpoint directory, got {cfg.model!r}")
    return LocalBackend(cfg.model, seed=cfg.seed, model_name=cfg.served_model_name)


def build_app(cfg: ProxyConfig, backend=None, adapters=None):
    from harnessrl.proxy.app import ADAPTERS, create_app

    cfg.check()
    return create_app(cfg, backend if backend is not None else load_backend(cfg), adapters or ADAPTERS)


def _uvicorn_config(app, cfg: ProxyConfig, log_config: dict | None = None) -> uvicorn.Config:
    extra = {"log_config": log_config} if log_config is not None else {}
    return uvicorn.Config(app, loop="uvloop", http="httptools", log_level=cfg.log_level, access_log=False,
                          lifespan="on", timeout_keep_alive=75, backlog=4096,
                          # the Responses WebSocket transport (`surfaces.responses.websocket`): a
                          # message is a request body
                          ws="websockets-sansio", ws_max_size=cfg.max_body_bytes,
                          proxy_headers=False, **extra)


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(4096)
    sock.set_inheritable(True)
    return sock


def serve(cfg: ProxyConfig, mounts: Callable[[], dict[str, Any]] | None = None,
          log_config: dict | None = None) -> None:
    """Run in the foreground until interrupted. `mounts()`: path → ASGI app served beside the API
    (the app layer passes the trace viewer at /ui), on FastAPI's side of the hot-path split;
    called once the app (and so the records DB) exists. `log_config`: uvicorn's, from `logs.configure`.
    `cfg.workers` > 1: that many processes on the one socket (`workers.py`)."""
    def run_one(sock: socket.socket) -> None:
        app = build_app(cfg)
        for path, sub in (mounts() if mounts else {}).items():
            app.mount(path, sub)
        uvicorn.Server(_uvicorn_config(app, cfg, log_config)).run(sockets=[sock])

    if cfg.workers > 1:  # cfg was checked by the caller (the CLI), so a refused setting never forks
        from harnessrl.proxy.workers import serve_workers

        serve_workers(cfg, run_one, _bind(cfg.host, cfg.port))
    else:
        run_one(_bind(cfg.host, cfg.port))


@dataclass
class RunningProxy:
    url: str  # http://host:port
    app: object
    server: uvicorn.Server

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@contextmanager
def run_proxy(cfg: ProxyConfig, backend=None, adapters=None) -> Iterator[RunningProxy]:
    """The proxy on a real socket (port 0: a free one) for the duration of the block.
    `backend`: an already loaded local backend to share (else loaded from cfg.model);
    `adapters`: the API surfaces to serve (default: the OpenAI ones, `app.ADAPTERS`)."""
    app = build_app(cfg, backend, adapters)
    sock = _bind(cfg.host, cfg.port)
    server = uvicorn.Server(_uvicorn_config(app, cfg))
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="harnessrl-proxy", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if failure or not thread.is_alive():
            raise UserError(f"the proxy failed to start: {failure[0] if failure else 'server exited'}")
        if time.monotonic() > deadline:
            raise UserError("the proxy did not start within 60 s")
        time.sleep(0.01)
    host, port = sock.getsockname()[:2]
    try:
        yield RunningProxy(f"http://{cfg.host if cfg.host not in ('0.0.0.0', '::') else '127.0.0.1'}:{port}",
                           app, server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
