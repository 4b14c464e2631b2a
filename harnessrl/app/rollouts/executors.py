"""Where a loop's rollouts run: `--executor local` (the default: threads of the loop's process,
`harness_examples.runner.run_many`) or `--executor ray` (each rollout a Ray task on any node of a
Ray cluster, `ray_rollouts.py`). Both take the same jobs (task × sample), run each through the
harness's runner (`HarnessTasks.run`), hand back one result per job in job order, and give a
rollout up at its deadline: a backstop above the harness's own timeout, so that one hung rollout
cannot hang the round. A rollout given up, or lost with its Ray node, is a result with an error
and no rollout id: failed, never a 0 reward.

After a batch, `settle` finishes as `failed` every rollout of its run tag that the batch did not
count: one given up at its deadline, one whose Ray node died before it finished (Ray ran the task
again, which made a second rollout), one whose result was lost and redone. So each job has at most
one counted rollout in the records, and compile (which skips failed rollouts) reads exactly those.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from harnessrl.app.rollouts.harnesses import HarnessTasks, Runner
from harnessrl.client import HarnessRL
from harnessrl.errors import UserError
from harnessrl.harness_examples.chat import RolloutResult
from harnessrl.harness_examples.runner import run_many

EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class Job:
    """One rollout to run: a task, and where its rollout goes (group, run tag)."""
    task: Any
    task_id: str
    group_id: str
    run_tag: str
    temperature: float

    def run(self, runner: Runner, url: str) -> Any:
        return runner(url, self.task, self.group_id, self.run_tag, self.temperature)


def jobs_for(h: HarnessTasks, tasks: list[Any], group: int, run_tag: str, temperature: float) -> list[Job]:
    """`group` jobs per task, the group id naming run and task (advantages are per group)."""
    return [Job(t, h.task_id(t), f"{run_tag}/{h.task_id(t)}", run_tag, temperature) for t in tasks for _ in range(group)]


def lost(job: Job, why: str) -> RolloutResult:
    """The result of a job whose rollout never came back."""
    return RolloutResult(rollout_id="", task_id=job.task_id, outcome=0.0, error=why)


class Executor(Protocol):
    proxy_host: str  # the address the proxy must listen on for the rollouts to reach it

    def map(self, runner: Runner, url: str, jobs: list[Job], label: str) -> list[Any]: ...


class LocalExecutor:
    """Threads of this process, `concurrency` rollouts at a time. A rollout of `--cmd` is its own
    process and a Python harness waits on the proxy, so threads overlap (tests/test_loop_concurrency.py)."""
    proxy_host = "127.0.0.1"

    def __init__(self, concurrency: int, deadline: float | None) -> None:
        self.concurrency, self.deadline = concurrency, deadline

    def map(self, runner: Runner, url: str, jobs: list[Job], label: str) -> list[Any]:
        return run_many(lambda job: job.run(runner, url), jobs, 1, self.concurrency, label, self.deadline,
                        lambda job: lost(job, f"no result within the {self.deadline:g} s rollout deadline"))


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


def counted(results: list[Any]) -> tuple[str, ...] | None:
    """The rollout ids the results count, or None where a result does not name its rollout (a user
    harness may return just the outcome): then only its run tag says which rollouts are the batch's."""
    ids = tuple(r.rollout_id for r in results if getattr(r, "rollout_id", ""))
    named = all(getattr(r, "rollout_id", "") for r in results if not getattr(r, "error", None))
    return ids if named else None


def settle(url: str, run_tag: str, results: list[Any]) -> int:
    """Finish as failed every rollout of `run_tag` the results do not count: all of them when the
    results name their rollouts, else those still running. Returns how many were failed."""
    ids = counted(results)
    keep = set(ids or ())
    n = 0
    with HarnessRL(url) as client:  # the operator's key (`client.default_key`)
        for ro in client.list_rollouts(run=run_tag):
            if ro["id"] in keep or ro["status"] == "failed" or (ids is None and ro["status"] != "running"):
                continue
            why = ("abandoned: its attempt ended without a result (rollout deadline, or its Ray node was lost)"
                   if ro["status"] == "running" else "not counted: another attempt of its job was counted")
            client.finish(ro["id"], error=why)
            n += 1
    return n
