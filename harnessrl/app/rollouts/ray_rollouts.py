"""`--executor ray`: each rollout a Ray task, run on any node of a Ray cluster.

The driver (the loop's process) runs the proxy, listening on the address by which the cluster
knows the driver's node, so that every node reaches it; a task runs the harness's runner on its
node, where the runner makes the rollout's workspace and runs the harness. The nodes import
harnessrl from the Python that runs Ray there: install it (the same version) on every node.

A task whose node or worker dies is run again by Ray (`retries` times) on a node that is alive;
the rollout its first attempt had made is left unfinished and `jobs.settle` fails it after
the batch (or, in `loop --async`, after its group). A task still out at its deadline is cancelled (its worker killed) and counted as
failed, like one whose retries ran out. The deadline runs from the task's submission: with
`--concurrency` above the cluster's CPUs, time queued in Ray counts too.

The driver's operator key for the proxy (made by the loop's embedded proxy, `run_cmd.owned_proxy`)
goes to the tasks as an argument, held in the worker's memory for the runner's client; the
rollout's program gets its rollout's own key only, as under the local executor.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Hashable
from typing import Any

from harnessrl.app.rollouts.harnesses import Runner
from harnessrl.app.rollouts.jobs import Job, lost, raised
from harnessrl.client import default_key, remember_key
from harnessrl.errors import UserError

RETRIES = 3  # runs of a task after its node or worker died (Ray's default for tasks)


def _run_job(runner: Runner, url: str, key: str | None, job: Job) -> Any:
    """The Ray task: one rollout, on whichever node Ray placed it; `key`: the driver's operator key."""
    if key:
        remember_key(url, key)
    return job.run(runner, url)


def _check_reachable(address: str) -> None:
    """Ray's own connect retries for minutes on a wrong address: a socket says it at once."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--ray-address {address!r}: use HOST:PORT of the cluster's head (its GCS port, "
                        "6379 by default), or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise UserError(f"--ray-address {address}: no Ray head answers there ({exc.strerror or exc})") from None


class RayExecutor:
    def __init__(self, address: str | None, concurrency: int, deadline: float | None, retries: int = RETRIES) -> None:
        try:
            import ray
        except ImportError:
            raise UserError("--executor ray: Ray is not installed in this environment (the `ray` extra: "
                            "scripts/install.sh installs it, or pip install ray)") from None
        if address and address != "auto":
            _check_reachable(address)
        try:
            # log_to_driver off: a rollout's output is the harness's (cmd logs), not the loop's terminal
            ray.init(address=address or None, log_to_driver=False, include_dashboard=False,
                     logging_level=logging.WARNING, configure_logging=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UserError(f"--executor ray: cannot join the Ray cluster at {address or 'a new local one'}: "
                            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        self._ray = ray
        self.proxy_host = ray.util.get_node_ip_address()
        self.concurrency, self.deadline = concurrency, deadline
        # one CPU per rollout: a node runs as many rollouts at once as it has CPUs
        self._task = ray.remote(_run_job).options(num_cpus=1, max_retries=retries, retry_exceptions=False)

    def flight(self, runner: Runner, url: str) -> RayFlight:
        return RayFlight(self, self._ray.put(runner), url, self._ray.put(default_key(url)))

    def _collect(self, ref: Any, job: Job) -> Any:
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # the runner raised: as in the local executor
            if isinstance(exc.cause, UserError):
                raise exc.cause from None
            return raised(job, exc.cause if isinstance(exc.cause, BaseException) else exc)
        except ray.exceptions.RayError as exc:  # node or worker lost after all retries, or cancelled
            first = (str(exc).strip().splitlines() or [""])[0]
            return lost(job, f"ray: {type(exc).__name__}: {first}"[:300])

    def close(self) -> None:
        self._ray.shutdown()


class RayFlight:
    """Ray tasks in flight, each under the caller's key; `runner_ref`: the runner, shipped to the
    object store once, not with every task."""

    def __init__(self, ex: RayExecutor, runner_ref: Any, url: str, key_ref: Any) -> None:
        self.ex, self.runner_ref, self.url, self.key_ref = ex, runner_ref, url, key_ref
        self._pending: dict[Any, tuple[Hashable, Job, float]] = {}  # task ref -> (key, job, when submitted)

    def submit(self, key: Hashable, job: Job) -> None:
        ref = self.ex._task.remote(self.runner_ref, self.url, self.key_ref, job)
        self._pending[ref] = (key, job, time.monotonic())

    def inflight(self) -> int:
        return len(self._pending)

    def cancel(self) -> None:
        """A task not yet started never starts, a running one's worker is killed; waits until Ray
        has done both, so no rollout opens after this returns."""
        ray, refs = self.ex._ray, list(self._pending)
        for ref in refs:
            ray.cancel(ref, force=True)
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=60)
        self._pending.clear()

    def drain(self, timeout: float) -> None:
        """Nothing is left: `cancel` waited for Ray to stop every task."""

    def finished(self, timeout: float | None) -> list[tuple[Hashable, Job, Any]]:
        if not self._pending:
            return []
        ray, deadline = self.ex._ray, self.ex.deadline
        wait = timeout
        if deadline is not None:
            due = max(0.0, min(t0 for *_, t0 in self._pending.values()) + deadline - time.monotonic())
            wait = due if wait is None else min(wait, due)
        ready, rest = ray.wait(list(self._pending), num_returns=1, timeout=wait)
        if ready and rest:  # every other one finished by now too
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        out = []
        for ref in ready:
            key, job, _ = self._pending.pop(ref)
            out.append((key, job, self.ex._collect(ref, job)))
        now = time.monotonic()
        for ref, (key, job, t0) in list(self._pending.items()):
            if deadline is not None and now - t0 >= deadline:
                ray.cancel(ref, force=True)  # kills the worker, and the harness under it
                del self._pending[ref]
                out.append((key, job, lost(job, f"no result within the {deadline:g} s rollout deadline")))
        return out
