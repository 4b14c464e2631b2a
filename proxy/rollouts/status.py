"""Which rollouts a call may go to, without a DB read per call.

A bounded LRU of rollout id → status. "finished" (and "failed") is final, so a cached one is always
right; a cached "running" may be stale (finished through another proxy): that is caught where
it matters, when the call is committed (`record.call_rows`), and the cache is corrected then. A rollout
id seen for the first time is created (running, no task) unless the proxy runs with
`--strict-rollouts`: black-box harnesses can only choose a URL or a key, not call an API first.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool

from harnessrl.proxy.errors import ProxyError, database_unavailable
from harnessrl.proxy.rollouts.store import Rollouts
from harnessrl.records import UNASSIGNED_ROLLOUT

log = logging.getLogger("harnessrl.proxy")


# the cached status of a rollout this proxy finished for being idle (`idle.py`; "finished" in the DB)
IDLE = "idle"


def finished(rollout_id: str, idle: bool = False) -> ProxyError:
    """A model call to a finished rollout: 410, which the OpenAI and Anthropic SDKs do not retry
    (they retry 408, 409, 429 and 5xx: a 409 cost a harness ~21 requests over ~3 minutes)."""
    why = (": it was created on first use and had no call or reward for --rollout-idle seconds; name a new "
           "rollout" if idle else "")
    return ProxyError(410, f"rollout {rollout_id!r} is finished{why}", code="rollout_finished")


class RolloutStatus:
    def __init__(self, store: Rollouts, strict: bool, max_entries: int = 65_536) -> None:
        self.store = store  # the rollout rows (also the idle sweep's, `idle.py`)
        self._strict = strict
        self._max = max_entries
        self._known: OrderedDict[str, str] = OrderedDict({UNASSIGNED_ROLLOUT: "running"})

    def __len__(self) -> int:
        return len(self._known)

    def set(self, rollout_id: str, status: str) -> None:
        self._known[rollout_id] = status
        self._known.move_to_end(rollout_id)
        if len(self._known) > self._max:
            self._known.popitem(last=False)

    async def check(self, rollout_id: str) -> None:
        """Raise the error for a call to `rollout_id`: 404 (strict, no such rollout), 410 (finished)."""
        status = self._known.get(rollout_id)
        if status is None:
            try:
                status = await run_in_threadpool(self.store.status, rollout_id, not self._strict)
            except DBAPIError as exc:
                log.warning("records DB error reading rollout %s: %s", rollout_id, exc)
                raise database_unavailable() from None
            if status is None:
                raise ProxyError(404, f"rollout {rollout_id!r} does not exist (create it with POST "
                                      "/harnessrl/rollouts, or run the proxy without --strict-rollouts)",
                                 code="rollout_not_found")
            self.set(rollout_id, status)
        else:
            self._known.move_to_end(rollout_id)
        if status != "running":  # finished, or failed
            raise finished(rollout_id, status == IDLE)
