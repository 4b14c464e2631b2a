"""Finishing the rollouts nobody finishes.

A rollout created on first use — a harness pointed at `/r/<rollout>/a/<agent>/v1`, or naming it
by header or key, with no call to the rollout API (`status.py`) — has no owner to finish it, and
stayed `running` forever. Such a rollout that has had no call and no reward for `--rollout-idle`
seconds is finished, `finished_by: idle` in its metadata: it takes no more calls (410, as any
finished rollout), still takes its outcome (`harnessrl reward`), and compiles as any finished
rollout. Rollouts created through the API are their creator's to finish; the unassigned rollout
(calls that name none) is never finished.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool

from harnessrl.proxy.prefix.index import PrefixIndex
from harnessrl.proxy.rollouts.status import IDLE, RolloutStatus

log = logging.getLogger("harnessrl.proxy")


def sweep_interval(idle_s: float) -> float:
    """A quarter of the idle time, at most a minute: a rollout is finished within 1.25 × idle_s."""
    return min(max(idle_s / 4, 0.05), 60.0)


async def finish_idle_rollouts(idle_s: float, statuses: RolloutStatus, index: PrefixIndex) -> None:
    """Run until cancelled (the proxy's lifespan): every `sweep_interval`, finish the idle
    rollouts, then mark them finished in the status cache and drop them from the prefix index,
    here on the event loop thread that owns both."""
    while True:
        await asyncio.sleep(sweep_interval(idle_s))
        try:
            done = await run_in_threadpool(statuses.store.finish_idle, idle_s, time.time())
        except DBAPIError as exc:  # the DB is away: the next sweep tries again
            log.warning("records DB error finishing idle rollouts: %s", exc)
            continue
        for rollout_id in done:
            statuses.set(rollout_id, IDLE)
            index.forget(rollout_id)
            log.info("rollout %s finished: no call or reward for %.0f s (--rollout-idle)", rollout_id, idle_s)
