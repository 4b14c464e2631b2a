"""`harnessrl proxy --workers N`: N proxy processes on one listening socket and one records DB.

One proxy process is bound by one core (its event loop runs the hot path's Python); where there
are more cores, more processes serve more calls. They share only the socket (the kernel hands
each new connection to one of them) and the records DB, which is what keeps them correct
together: each call's `seq` is taken from its rollout's row inside the commit's own transaction
(a row lock on PostgreSQL, the write lock on SQLite), and a rollout finished through one worker
is refused at commit by the others. What stays per process: the prefix index (a call extending
one that another worker served is recorded without `prefix_call_id`), the rollout-status cache,
`/metrics` (a scrape sees the worker that answered it; `/health` names it). Hence workers need
one upstream in pass-through mode (`ProxyConfig.check`).

The parent migrates the DB once, forks the workers while it has no thread and no connection,
and replaces a worker that dies; a worker that dies within its first seconds stops them all (a
setup error would only repeat).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable

from harnessrl.errors import UserError
from harnessrl.proxy.config import ProxyConfig

log = logging.getLogger("harnessrl.proxy")
_EARLY_S = 5.0  # a worker that exits sooner than this after its start failed to start


def serve_workers(cfg: ProxyConfig, run_one: Callable[[socket.socket], None], sock: socket.socket) -> None:
    """Run `run_one(sock)` (one proxy serving on the shared socket) in `cfg.workers` processes
    until SIGINT or SIGTERM, which each worker also gets and finishes its calls on."""
    from harnessrl.db import open_db

    engine, _ = open_db(cfg.db)  # migrations run here, once, not raced by the workers
    engine.dispose()
    parent = os.getpid()
    children: dict[int, float] = {}  # pid -> when it started
    state = {"stopping": False, "failed": False}

    def start() -> None:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                run_one(sock)
                code = 0
            except UserError as exc:
                log.error("worker %d: %s", os.getpid(), exc)
            except BaseException:  # noqa: BLE001 - reported, and the parent sees the exit
                log.exception("worker %d stopped", os.getpid())
            finally:
                os._exit(code)
        children[pid] = time.monotonic()

    def stop(_signum=None, _frame=None) -> None:
        if os.getpid() != parent:  # a signal in the instant between fork and the child's reset
            return
        state["stopping"] = True
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for _ in range(cfg.workers):
            start()
        while children:
            pid, status = os.wait()
            began = children.pop(pid, None)
            if began is None or state["stopping"]:
                continue
            how = f"exit status {os.waitstatus_to_exitcode(status)}"
            if time.monotonic() - began < _EARLY_S:
                log.error("proxy worker %d failed to start (%s); stopping the others", pid, how)
                state["failed"] = True
                stop()
                continue
            log.warning("proxy worker %d exited (%s); starting another", pid, how)
            start()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if state["failed"]:
        raise UserError("a proxy worker failed to start; its reason is in the log above")
