"""`--executor ray`: each rollout a Ray task, run on any node of a Ray cluster.

The driver (the loop's process) runs the proxy, listening on the address by which the cluster
knows the driver's node, so that every node reaches it; a task runs the harness's runner on its
node, where the runner makes the rollout's workspace and runs the harness. The nodes import
harnessrl from the Python that runs Ray there: install it (the same version) on every node.

A task whose node or worker dies is run again by Ray (`retries` times) on a node that is alive;
the rollout its first attempt had made is left unfinished and `executors.settle` fails it after
the batch. A task still out at its deadline is cancelled (its worker killed) and counted as
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
from typing import Any

from rich.progress import Progress

from harnessrl.app.rollouts.executors import Job, lost
from harnessrl.app.rollouts.harnesses import Runner
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

    def map(self, runner: Runner, url: str, jobs: list[Job], label: str) -> list[Any]:
        ray = self._ray
        results: list[Any] = [None] * len(jobs)
        runner_ref = ray.put(runner)  # shipped to the object store once, not with every task
        key_ref = ray.put(default_key(url))
        pending: dict[Any, tuple[int, float]] = {}  # task ref -> (job index, when it was submitted)
        waiting = iter(range(len(jobs)))
        with Progress(transient=True) as progress:
            bar = progress.add_task(label, total=len(jobs))
            while True:
                while len(pending) < self.concurrency and (i := next(waiting, None)) is not None:
                    pending[self._task.remote(runner_ref, url, key_ref, jobs[i])] = (i, time.monotonic())
                if not pending:
                    break
                wait = None
                if self.deadline is not None:
                    wait = max(0.0, min(t0 for _, t0 in pending.values()) + self.deadline - time.monotonic())
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait)
                for ref in ready:
                    i, _ = pending.pop(ref)
                    results[i] = self._collect(ref, jobs[i])
                    progress.advance(bar)
                now = time.monotonic()
                for ref, (i, t0) in list(pending.items()):
                    if self.deadline is not None and now - t0 >= self.deadline:
                        ray.cancel(ref, force=True)  # kills the worker, and the harness under it
                        del pending[ref]
                        results[i] = lost(jobs[i], f"no result within the {self.deadline:g} s rollout deadline")
                        progress.advance(bar)
        return results

    def _collect(self, ref: Any, job: Job) -> Any:
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # the runner raised: as in the local executor
            raise exc.cause if isinstance(exc.cause, UserError) else exc from None
        except ray.exceptions.RayError as exc:  # node or worker lost after all retries, or cancelled
            first = (str(exc).strip().splitlines() or [""])[0]
            return lost(job, f"ray: {type(exc).__name__}: {first}"[:300])

    def close(self) -> None:
        self._ray.shutdown()
