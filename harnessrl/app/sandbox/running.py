"""The commands running now, each under the thread that waits for it: whoever owns the threads
(the async loop's flight, once training has ended) can stop their commands, and none outlives
this process (at exit every one still running is stopped), sandbox or not."""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

_running: dict[int, set[Callable[[], None]]] = {}
_lock = threading.Lock()


@contextmanager
def registered(stop: Callable[[], None]) -> Iterator[None]:
    """`stop` kills the command this thread waits for, while the block runs."""
    ident = threading.get_ident()
    with _lock:
        _running.setdefault(ident, set()).add(stop)
    try:
        yield
    finally:
        with _lock:
            left = _running.get(ident, set())
            left.discard(stop)
            if not left:
                _running.pop(ident, None)


def stop_threads(idents: Iterable[int | None]) -> int:
    """Stops the commands these threads wait for; returns how many."""
    with _lock:
        stops = [stop for i in idents if i is not None for stop in _running.get(i, ())]
    for stop in stops:
        stop()
    return len(stops)


@atexit.register
def _stop_all() -> None:
    stop_threads(list(_running))
