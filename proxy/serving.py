"""Serving a call end to end, for any route and any API adapter: find the earlier call it
extends, let the route build the prompt and run the model, record the outcome, answer.

Every outcome — an answer, a rejected prompt, a failed or malformed upstream, a stream cut
short — goes through `fail` or `fill` + `commit`, so it leaves a call record, and the harness
gets its answer (or its OpenAI-shaped error) only once that record is committed. Those four and
`remember` (the prefix index) are the recording API that the other ways of serving a call use:
`fanout` (n > 1), `surfaces.embeddings` and `refusals`. They import this module, never the other
way round: the app hands `Serving` the first two (`Lifespan`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import replace

import orjson
from starlette.responses import Response

from harnessrl.messages import content_text
from harnessrl.proxy.answers import JSONAnswer, Last, StreamAnswer
from harnessrl.proxy.errors import ProxyError, as_proxy_error, database_unavailable, error_response
from harnessrl.proxy.identity import Identity, unnamed_agent
from harnessrl.proxy.prefix.index import PrefixIndex, Turn
from harnessrl.proxy.prefix.rewrites import Rewrites
from harnessrl.proxy.prefix.volatile import Volatile
from harnessrl.proxy.protocol import Delta, Progress, Prompt, Request, Result, Route
from harnessrl.proxy.record.recorder import CallRecord, DatabaseUnavailable, RecordError, Recorder, RolloutFinished
from harnessrl.proxy.rollouts.status import RolloutStatus, finished
from harnessrl.proxy.surfaces.adapter import Wire
from harnessrl.records import pack_ids, pack_logprobs


log = logging.getLogger("harnessrl.proxy.calls")


# serving a call another way: (serving, request, identity, call id, wire) -> the answer
ServeOther = Callable[["Serving", Request, Identity, str, Wire], Awaitable[Response]]


class Serving:
    """One route behind any number of API adapters; owns the in-memory prefix index.
    `statuses` learns of rollouts found finished at commit; `metrics` (`prometheus.ProxyMetrics`)
    counts every call once it is answered. `embeddings` serves `/v1/embeddings` calls and
    `fanout` calls with n > 1 or best_of > 1 (`surfaces.embeddings.serve_embeddings`,
    `fanout.handle_n`), through the recording API below."""

    def __init__(self, route: Route, recorder: Recorder, statuses: RolloutStatus | None = None,
                 prefix_bytes: int = 256 * 1024 * 1024, metrics=None, volatile: Volatile | None = None,
                 hold: bool = False, *, embeddings: ServeOther, fanout: ServeOther,
                 rewrites: Rewrites | None = None) -> None:
        self.route = route
        self.embeddings, self.fanout = embeddings, fanout
        self.recorder = recorder
        self.index = PrefixIndex(max_bytes=prefix_bytes)
        self.statuses = statuses
        self.metrics = metrics
        # volatile spans: ignored by agent fingerprints always; held (the model sent the earlier
        # call's values) only when the proxy builds prompts as exact extensions (prefix mode)
        self.volatile = volatile or Volatile()
        self.hold = hold
        # earlier replies a harness sends back in its own form (`prefix/rewrites.py`): held like volatile
        # spans (prefix mode only), noted in any mode where they keep a call from extending its turn
        self.rewrites = rewrites or Rewrites()

    async def handle(self, req: Request, ident: Identity, call_id: str, wire: Wire,
                     errors: Callable[..., Response] = error_response) -> Response:
        if not self.recorder.admit():  # the failed-call journal is full: this call could not be recorded
            return errors(database_unavailable(), {"x-harnessrl-call": call_id})
        if ident.agent is None and ident.session is None and req.chat:
            ident = unnamed_agent(ident, req.body, self.volatile)
        if req.endpoint == "embeddings":
            return await self.embeddings(self, req, ident, call_id, wire)
        if req.best_of > 1:
            return await self.fanout(self, req, ident, call_id, wire)
        t0 = time.perf_counter()
        rec = self.record(req, ident, call_id)
        headers = {"x-harnessrl-call": call_id}
        try:
            turn, req = self._extends(req, ident, rec) if req.chat else (None, req)
            prompt = await self.route.prompt(req, turn)
            rec.prompt_path, rec.prefix_call_id, rec.drift = prompt.path, prompt.prefix_call_id, prompt.drift
            tm = time.perf_counter()  # the model's (or upstream's) share of the latency starts here
            if req.stream:
                events = self.route.stream(req, prompt)
                first = await anext(events)
                return StreamAnswer(self._relay(req, ident, rec, wire, first, events, t0, tm, prompt), headers,
                                    getattr(wire, "media_type", "text/event-stream"))
            result = await self.route.run(req, prompt)
            model_s = time.perf_counter() - tm
            data = wire.response(result)
            body = orjson.dumps(data)
            self.fill(rec, result, data, t0, body)
        except Exception as exc:  # noqa: BLE001 - every failure is recorded and answered
            err = await self.fail(rec, as_proxy_error(exc, rec.id), t0)
            return errors(err, headers)
        try:
            await self.commit(rec, model_s)
        except ProxyError as err:
            return errors(err, headers)
        self.remember(rec, ident, req, result, prompt.turn)
        return JSONAnswer(body, call_id)

    def _extends(self, req: Request, ident: Identity, rec: CallRecord) -> tuple[Turn | None, Request]:
        """The earlier call this one extends, and the request the route runs: the harness's, or,
        where some of its messages differ from that call's only in volatile spans or are its
        replies rewritten by the harness in a form a rewrite rule recognises, one with those
        messages as the model saw them then (`prefix/volatile.py`, `prefix/rewrites.py`); the
        record keeps the harness's text and notes what was held. A call that extends nothing
        although it re-sends an earlier reply rewritten is noted too (`harnessrl_rewrite`)."""
        hold = (self.volatile, self.rewrites) if self.hold else (None, None)
        turn, held = self.index.match(_key(ident), req.messages, req.tools, *hold)
        if turn is None:
            if (t := self.index.rewritten(_key(ident), req.messages, req.tools, self.volatile, self.rewrites)):
                rule = self.rewrites.rule_of(req.messages[t.n_messages], t.reply)
                rec.request = {**rec.request, "harnessrl_rewrite": {"call": t.call_id, "message": t.n_messages,
                                                                    "rule": rule}}
            return None, req
        if not held:
            return turn, req
        seen = turn.messages
        sent = list(req.messages)
        spans, rewrites = [], []
        for i in held:
            sent[i] = seen[i] if i < len(seen) else turn.reply
            if (rule := self.rewrites.rule_of(req.messages[i], sent[i])) is not None:
                rewrites.append({"message": i, "rule": rule})
                continue
            spans += [{"message": i, "sent": a, "harness": b}
                      for a, b in self.volatile.held(_text(sent[i]), _text(req.messages[i]))]
        note = {"call": turn.call_id, "spans": spans, **({"rewrites": rewrites} if rewrites else {})}
        rec.request = {**rec.request, "harnessrl_held": note}
        return turn, replace(req, body={**req.body, "messages": sent})

    def record(self, req: Request, ident: Identity, call_id: str) -> CallRecord:
        """A call's record before it runs. `model` is the checkpoint that serves it when the
        route knows one (the local backend's directory: compile finds the tokenizer there)."""
        return CallRecord(id=call_id, rollout_id=ident.rollout, session_id=ident.session, agent=ident.agent,
                          parent_call_id=ident.parent_call, endpoint=req.endpoint,
                          surface=req.via or req.endpoint, client=req.client,
                          model=getattr(self.route, "model_path", None) or req.body.get("model"),
                          stream=req.stream, created_at=time.time(),
                          request=_recorded(req))

    async def _relay(self, req: Request, ident: Identity, rec: CallRecord, wire: Wire, first: list[Delta] | Result,
                     events: AsyncGenerator[list[Delta] | Result, None], t0: float, tm: float,
                     prompt: Prompt) -> AsyncIterator[bytes]:
        """Send deltas as they come, but hold the terminal ones until the call is committed. A
        harness that hangs up first leaves a "cancelled" call with what was generated."""
        held: list[Delta] = []
        item = first
        try:
            try:
                while not isinstance(item, Result):
                    ready = []
                    for d in item:
                        (held if held or d.terminal else ready).append(d)
                    if ready:
                        yield wire.chunks(ready)
                    item = await anext(events, None)
                    if item is None:
                        raise RuntimeError("the model stream ended without a result")
                result = item
                model_s = time.perf_counter() - tm
                self.fill(rec, result, wire.response(result), t0)
            except (GeneratorExit, asyncio.CancelledError):
                self._cancelled(rec, prompt.progress, t0)
                raise
            except Exception as exc:  # noqa: BLE001 - recorded; the stream ends with the error
                yield wire.error(await self.fail(rec, as_proxy_error(exc, rec.id), t0))
                return
        finally:  # a harness that hung up stops the model too
            await events.aclose()
        try:
            await self.commit(rec, model_s)
        except ProxyError as err:
            yield wire.error(err)
            return
        yield Last((wire.chunks(held) if held else b"") + wire.close(result))
        self.remember(rec, ident, req, result, prompt.turn)

    def fill(self, rec: CallRecord, r: Result, data: dict, t0: float, encoded: bytes | None = None) -> None:
        """Put a finished call's outcome in its record: ids, log-probs, usage, the answer `data`
        as the harness gets it (without token-id fields), latency since `t0`. Not yet committed.
        `encoded`: `data` as the JSON sent, recorded as it is when the record keeps all of it."""
        rec.prompt_ids = pack_ids(r.prompt_ids)
        rec.completion_ids = pack_ids(r.completion_ids)
        rec.completion_logprobs = pack_logprobs(r.logprobs)
        rec.weight_version = r.weight_version
        u = r.usage or {}
        rec.prompt_tokens = u.get("prompt_tokens", len(r.prompt_ids) if r.prompt_ids is not None else None)
        rec.completion_tokens = u.get("completion_tokens",
                                      len(r.completion_ids) if r.completion_ids is not None else None)
        rec.finish_reason = r.finish_reason
        rec.response, rec.response_text, rec.tool_calls = _stored(data), r.text, r.tool_calls
        if encoded is not None and rec.response is data:  # the same JSON: encoded once, not again at commit
            rec.response_json = encoded.decode()
        if r.drift is not None:
            rec.drift = r.drift
        rec.latency_ms = (time.perf_counter() - t0) * 1e3

    async def fail(self, rec: CallRecord, err: ProxyError, t0: float) -> ProxyError:
        """Record the failure; the error to answer (the recorder's, if it could not be recorded)."""
        rec.status, rec.error = "error", f"{err.status} {err.type}: {err.message}"
        rec.latency_ms = (time.perf_counter() - t0) * 1e3
        try:
            await self.commit(rec, code=err.code)
        except ProxyError as commit_err:
            return commit_err
        return err

    def _cancelled(self, rec: CallRecord, progress: Progress, t0: float) -> None:
        """Record a stream the harness abandoned, with what was generated until then. Not awaited:
        the task may be cancelled already."""
        rec.status, rec.error = "cancelled", "the client closed the stream before it ended"
        rec.prompt_ids = pack_ids(progress.prompt_ids)
        rec.completion_ids = pack_ids(progress.completion_ids)
        rec.completion_logprobs = pack_logprobs(progress.logprobs)
        rec.response_text = "".join(progress.text)
        rec.prompt_tokens = len(progress.prompt_ids) if progress.prompt_ids is not None else None
        rec.completion_tokens = len(progress.completion_ids)
        rec.latency_ms = (time.perf_counter() - t0) * 1e3
        self.recorder.submit(rec)
        self.done(rec, None, True)

    async def commit(self, rec: CallRecord, model_s: float | None = None, code: str | None = None) -> None:
        """Commit the record, then count and log the call. Raises the `ProxyError` to answer
        instead when it cannot be recorded (rollout finished, DB away, write refused)."""
        # the harness must not take an unrecorded answer; RecordError text is safe to show
        # (database error text is logged by the recorder with the call id)
        try:
            await self.recorder.commit(rec)
        except RolloutFinished:
            if self.statuses is not None:
                self.statuses.set(rec.rollout_id, "finished")
            self.done(rec, model_s, False, "rollout_finished")
            raise finished(rec.rollout_id) from None
        except DatabaseUnavailable as exc:
            self.done(rec, model_s, False, "database_unavailable")
            raise database_unavailable(str(exc)) from None
        except RecordError as exc:
            self.done(rec, model_s, False, "record_failed")
            raise ProxyError(500, f"the call could not be recorded: {exc}", "server_error",
                             code="record_failed") from None
        self.done(rec, model_s, True, code)

    def done(self, rec: CallRecord, model_s: float | None, recorded: bool, code: str | None = None) -> None:
        """Count and log a call once it is answered (`code`: the error code it was answered with;
        `recorded`: whether its record was committed)."""
        status = rec.status if recorded else "error"
        if self.metrics is not None:
            self.metrics.call(rec.endpoint, rec.surface or rec.endpoint, status, (rec.latency_ms or 0.0) / 1e3,
                              model_s)
        if log.isEnabledFor(logging.INFO):
            why = f" [{code}]" if code else ""
            why += f" ({rec.error})" if rec.error else ""
            log.info("%s call %s rollout %s: %s in %.1f ms%s", rec.surface or rec.endpoint, rec.id,
                     rec.rollout_id or "-", status, rec.latency_ms or 0.0, why, extra={"call_id": rec.id})

    def remember(self, rec: CallRecord, ident: Identity, req: Request, r: Result, parent: Turn | None) -> None:
        """Add a committed chat call to the prefix index, so the session's next call can extend
        it (`parent`: the turn it extended)."""
        if not req.chat or r.message is None or not r.prompt_ids or r.completion_ids is None:
            return
        self.index.add(_key(ident), Turn.of(rec.id, req.messages, req.tools, r.message, r.prompt_ids,
                                            r.completion_ids, self.route.eos_ids, parent))


def _recorded(req: Request) -> dict:
    if req.surface is None and req.notes is None:
        return req.body
    extra = {"harnessrl_surface": req.surface} if req.surface is not None else {}
    return {**req.body, **extra, **(req.notes or {})}


def _stored(data: dict) -> dict:
    """A response as recorded: without the token-id fields a harness gets with `return_token_ids`
    (`prompt_token_ids`; per choice `token_ids`, and `prompt_token_ids` on /v1/completions) —
    `prompt_ids` and `completion_ids` hold them, packed. As JSON a ~700-token prompt is ~3 KB, a
    third of the row, and every byte of a row is written twice (WAL, then checkpoint)."""
    choices = data.get("choices")
    in_choices = isinstance(choices, list) and any(isinstance(c, dict) and not _ID_FIELDS.isdisjoint(c)
                                                   for c in choices)
    if not in_choices and "prompt_token_ids" not in data:
        return data
    out = {k: v for k, v in data.items() if k != "prompt_token_ids"}
    if in_choices:
        out["choices"] = [{k: v for k, v in c.items() if k not in _ID_FIELDS} if isinstance(c, dict) else c
                          for c in choices]  # type: ignore[union-attr]
    return out


_ID_FIELDS = frozenset(("prompt_token_ids", "token_ids"))


def _text(m: dict) -> str:
    return content_text(m.get("content"))


def _key(ident: Identity) -> tuple:
    return (ident.rollout, ident.agent, ident.session)
