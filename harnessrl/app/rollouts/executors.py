"""Where a loop's rollouts run: `--executor local` (the default: threads of the loop's process) or
`--executor ray` (each rollout a Ray task on any node of a Ray cluster, `ray_rollouts.py`).

Both hand out a `Flight`: the rollouts in flight on one proxy. The loop submits jobs (`jobs.Job`)
to it as slots free and collects results as they finish, in any order; the synchronous loop's
batch (`run_batch`) is the same, waiting for all. Each job runs through the harness's runner
(`HarnessTasks.run`), and a rollout is given up at its deadline: a backstop above the harness's
own timeout, so that one hung rollout cannot hang the loop. A rollout given up, or lost with its
Ray node, is a result with an error and no rollout id (`jobs.lost`): failed, never a 0 reward.
So is a rollout whose runner raised (`jobs.raised`): its exception never leaves the executor, so
one rollout cannot end the loop (issue 54); only a `UserError` (the user's configuration, one line
for every rollout alike) is raised to the loop.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from rich.progress import Progress

from harnessrl.app.rollouts.harnesses import Runner
from harnessrl.app.rollouts.jobs import Job, lost, raised
from harnessrl.app.sandbox.running import stop_threads
from harnessrl.errors import UserError

EXECUTORS = ("local", "ray")


class Flight(Protocol):
    """Rollouts in flight on one proxy, each under a key of the caller's."""

    def submit(self, key: Hashable, job: Job) -> None: ...

    def inflight(self) -> int: ...

    def finished(self, timeout: float | None) -> list[tuple[Hashable, Job, Any]]:
        """The rollouts that finished (or were given up at their deadline) since the last call:
        waits until there is one, or `timeout` seconds (then maybe none)."""
        ...

    def cancel(self) -> None:
        """Give up every rollout in flight, so that none opens a rollout after this returns (where
        the executor can stop one: a Ray task is cancelled; a thread runs on, its result dropped)."""
        ...

    def drain(self, timeout: float) -> None:
        """After `cancel` (and after their rollouts were failed, which ends a harness at its next
        call): wait up to `timeout` s for what still runs, so that none is left half-way."""
        ...


class Executor(Protocol):
    proxy_host: str  # the address the proxy must listen on for the rollouts to reach it
    concurrency: int

    def flight(self, runner: Runner, url: str) -> Flight: ...


def run_batch(ex: Executor, runner: Runner, url: str, jobs: list[Job], label: str,
              seconds: list[float] | None = None) -> list[Any]:
    """Every job, `ex.concurrency` at a time; one result per job, in job order. `seconds`, when
    given, gets each rollout's wall time (for the loop's no-idle bound)."""
    flight = ex.flight(runner, url)
    results: list[Any] = [None] * len(jobs)
    started: dict[int, float] = {}
    waiting = iter(range(len(jobs)))
    with Progress(transient=True) as progress:
        bar = progress.add_task(label, total=len(jobs))
        while True:
            while flight.inflight() < ex.concurrency and (i := next(waiting, None)) is not None:
                started[i] = time.monotonic()
                flight.submit(i, jobs[i])
            if not flight.inflight():
                return results
            for i, _, result in flight.finished(None):
                results[i] = result  # type: ignore[index]
                if seconds is not None:
                    seconds.append(time.monotonic() - started[i])  # type: ignore[index]
                progress.advance(bar)


class LocalFlight:
    """A thread per rollout: a rollout of `--cmd` is its own process and a Python harness waits on
    the proxy, so threads overlap (tests/test_loop_concurrency.py). A thread given up at its
    deadline cannot be stopped: it is a daemon, so that it cannot hold the process at exit, and
    its result, should it come, is dropped."""

    def __init__(self, runner: Runner, url: str, deadline: float | None) -> None:
        self.runner, self.url, self.deadline = runner, url, deadline
        self._done: queue.Queue[tuple[Hashable, Any, BaseException | None]] = queue.Queue()
        self._running: dict[Hashable, tuple[Job, float]] = {}  # key -> (job, when it started)
        self._threads: dict[Hashable, threading.Thread] = {}
        self._cancelled = False
        self._cancelled_threads: list[threading.Thread] = []

    def submit(self, key: Hashable, job: Job) -> None:
        if key in self._running:
            raise ValueError(f"a rollout under key {key!r} is already in flight")
        self._running[key] = (job, time.monotonic())
        thread = threading.Thread(target=self._work, args=(key, job), name=f"rollout-{key}", daemon=True)
        self._threads[key] = thread
        thread.start()

    def _work(self, key: Hashable, job: Job) -> None:
        if self._cancelled:  # started too late: it opens no rollout
            return
        try:
            self._done.put((key, job.run(self.runner, self.url), None))
        except UserError as exc:  # the user's to fix: raised in the collecting thread
            self._done.put((key, None, exc))
        except Exception as exc:  # noqa: BLE001 - this rollout's fault: failed and counted, the loop goes on
            self._done.put((key, raised(job, exc), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the collecting thread, raised there
            self._done.put((key, None, exc))

    def inflight(self) -> int:
        return len(self._running)

    def cancel(self) -> None:
        """A thread cannot be stopped, but the command it waits for can (a `--cmd` rollout's): killed,
        its rollout ends failed ("stopped"); a Python harness's thread runs on, its result dropped."""
        self._cancelled = True
        stop_threads(self._threads[key].ident for key in self._running)
        self._cancelled_threads = [self._threads[key] for key in self._running]
        self._running.clear()
        self._threads.clear()

    def drain(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for thread in self._cancelled_threads:
            thread.join(max(0.0, end - time.monotonic()))

    def finished(self, timeout: float | None) -> list[tuple[Hashable, Job, Any]]:
        out: list[tuple[Hashable, Job, Any]] = []
        if not self._running:
            return out
        wait = timeout
        if self.deadline is not None:
            due = max(0.0, min(t0 for _, t0 in self._running.values()) + self.deadline - time.monotonic())
            wait = due if wait is None else min(wait, due)
        try:
            item = self._done.get(timeout=wait)
            while True:
                key, result, exc = item
                if key in self._running:  # else given up before: it was counted as failed
                    job, _ = self._running.pop(key)
                    self._threads.pop(key, None)
                    if exc is not None:
                        raise exc
                    out.append((key, job, result))
                item = self._done.get_nowait()
        except queue.Empty:
            pass
        now = time.monotonic()
        for key, (job, t0) in list(self._running.items()):
            if self.deadline is not None and now - t0 >= self.deadline:
                del self._running[key]  # its command has its own timeout, below the deadline
                self._threads.pop(key)
                out.append((key, job, lost(job, f"no result within the {self.deadline:g} s rollout deadline")))
        return out


class LocalExecutor:
    """Threads of this process, `concurrency` rollouts at a time."""
    proxy_host = "127.0.0.1"

    def __init__(self, concurrency: int, deadline: float | None) -> None:
        self.concurrency, self.deadline = concurrency, deadline

    def flight(self, runner: Runner, url: str) -> LocalFlight:
        return LocalFlight(runner, url, self.deadline)


@contextmanager
def open_executor(kind: str, concurrency: int, deadline: float | None, ray_address: str | None) -> Iterator[Executor]:
    if concurrency < 1:
        raise UserError("--concurrency must be at least 1")
    if deadline is not None and deadline <= 0:
        raise UserError("--rollout-deadline must be a positive number of seconds")
    if kind == "local":
        if ray_address:
            raise UserError("--ray-address is for --executor ray")
        yield LocalExecutor(concurrency, deadline)
    elif kind == "ray":
        from harnessrl.app.rollouts.ray_rollouts import RayExecutor

        ex = RayExecutor(ray_address, concurrency, deadline)
        try:
            yield ex
        finally:
            ex.close()
    else:
        raise UserError(f"--executor {kind!r}: use {' | '.join(EXECUTORS)}")
