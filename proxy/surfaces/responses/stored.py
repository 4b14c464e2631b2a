"""Earlier calls read back from the records: what `previous_response_id` extends and what
`GET /v1/responses/{id}` returns. The proxy keeps no state of its own for this — every call is
in the records DB already — so it works across proxy restarts and several proxy processes.

Rollouts are isolated: a request reads and continues only its own rollout's responses (the
operator, with the proxy's own key and no rollout named, any: `identity.reader_scope`). Another
rollout's id gets the answer of an id that does not exist — a 404, not a 403, so an answer never
tells that the id exists elsewhere.

`store: false` is honoured the way OpenAI does on the read side (the response cannot be fetched
or extended), but the call is recorded like any other: recording is what the proxy is for.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from harnessrl.proxy.errors import ProxyError, database_unavailable
from harnessrl.proxy.identity import valid_id
from harnessrl.proxy.surfaces.responses.request import RESPONSE_PREFIX
from harnessrl.records import Call

log = logging.getLogger("harnessrl.proxy")
Fetch = Callable[[str], Awaitable[dict | None]]


def load(session_factory: sessionmaker[Session], call_id: str) -> dict | None:
    """A recorded call as {rollout, api, store, ok, messages, reply, response, context_tools,
    loaded_tools}, or None."""
    with session_factory() as s:
        row = s.execute(select(Call.rollout_id, Call.request, Call.response, Call.response_text, Call.tool_calls,
                               Call.status).where(Call.id == call_id)).first()
    if row is None or not isinstance(row.request, dict):
        return None
    surface = row.request.get("harnessrl_surface") or {}
    reply = {"role": "assistant", "content": row.response_text}
    if row.tool_calls:
        reply["tool_calls"] = row.tool_calls
    return {"rollout": row.rollout_id, "api": surface.get("api"), "store": (surface.get("body") or {}).get("store") is not False,
            "ok": row.status == "ok", "messages": row.request.get("messages") or [], "reply": reply,
            "response": row.response, "context_tools": row.request.get("harnessrl_context_tools"),
            "loaded_tools": row.request.get("harnessrl_loaded_tools")}


class StoredCalls:
    """`await fetch(call_id)` from the event loop: the read runs in a worker thread."""

    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self.Session = session_factory

    async def fetch(self, call_id: str) -> dict | None:
        if not valid_id("call", call_id):
            # never an id (a U+0000 in it PostgreSQL cannot even compare: a 503 once, to retry forever)
            return None
        try:
            return await run_in_threadpool(load, self.Session, call_id)
        except DBAPIError as exc:
            log.warning("records DB error reading call %s: %s", call_id, exc)
            raise database_unavailable() from None

    def scoped(self, rollout: str | None) -> Fetch:
        """`fetch` that sees only `rollout`'s calls (None: every rollout's)."""
        async def fetch(call_id: str) -> dict | None:
            got = await self.fetch(call_id)
            return got if got is not None and (rollout is None or got["rollout"] == rollout) else None

        return fetch

    async def response(self, response_id: str, rollout: str | None) -> dict:
        """The stored Responses object `response_id` of `rollout` (None: any rollout's); 404 when
        there is none to show."""
        fetch = self.scoped(rollout)
        got = await fetch(response_id[len(RESPONSE_PREFIX):]) if response_id.startswith(RESPONSE_PREFIX) else None
        if got is None or got["api"] != "responses" or not got["store"] or got["response"] is None:
            raise ProxyError(404, f"response with id {response_id!r} not found", "not_found",
                             param="response_id", code="response_not_found")
        return got["response"]
