"""The rollouts a loop asks for (`Job`: task × sample, with its group and run tag) and their
accounting after a batch.

A rollout given up at its deadline, or lost with its Ray node, is a result with an error and no
rollout id (`lost`): failed, never a 0 reward. `settle` then finishes as `failed` every rollout
of the run tag that the results do not count: one given up at its deadline, one whose Ray node
died before it finished (Ray ran the task again, which made a second rollout), one whose result
was lost and redone. So each job has at most one counted rollout in the records, and compile
(which skips failed rollouts) reads exactly those (`counted`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harnessrl.app.rollouts.harnesses import HarnessTasks, Runner
from harnessrl.client import HarnessRL
from harnessrl.harness_examples.chat import RolloutResult


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


def raised(job: Job, exc: BaseException) -> RolloutResult:
    """The result of a job whose runner raised: failed, with the exception in one line."""
    first = (str(exc).strip().splitlines() or [""])[0]
    why = f"the rollout raised {type(exc).__name__}: {first}"[:300]
    why = why.encode("utf-8", "backslashreplace").decode()  # a message may hold an undecodable name
    return RolloutResult(rollout_id="", task_id=job.task_id, outcome=0.0, error=why)


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
