"""Model calls the proxy turns away before they reach `Serving.handle`, recorded like any failed call.

Once the API key is checked and the rollout is known to be running, a refusal — a body that
fails validation (400), one over the size limit (413), an unknown `previous_response_id` (400),
a sampling-policy refusal, no upstream to take it (503), a bug (500) — is written as a call row
with status `error` and the reason (`Serving.fail`: committed before the harness is answered,
counted in the rollout's `errors`, in `/metrics` and in the log). Without it a rollout whose
main call was refused looked like a rollout that ran, and compile scored it.

Refusals that leave no row, only the metrics (`harnessrl_proxy_refused`) and an info log line:
a wrong API key (401: an unauthenticated client must not create rollouts), a rollout's key
naming another rollout (403 `rollout_key_scope`: nothing is written into a rollout the key is not
for), an id that is not an id (400 from `identify`), an unknown rollout under `--strict-rollouts`
(404), the records DB away (503), and a finished rollout (410 `rollout_finished`): a finished rollout is immutable,
its outcome already fixed, so nothing more is written into it.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from starlette.responses import Response

from harnessrl.proxy.record.call_rows import CallRecord, new_call_id
from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.identity import Identity
from harnessrl.proxy.logs import call_id as current_call
from harnessrl.proxy.serving import Serving
from harnessrl.proxy.surfaces.adapter import Adapter

# surfaces whose body is what the records hold for any call (an OpenAI chat, completions or
# embeddings body); another surface's body is kept under "harnessrl_surface", untranslated
_RECORDS_SHAPED = frozenset(("chat", "completions", "embeddings"))
_MODEL_CHARS = 256  # `calls.model`: a refused body's model may be any length
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # PostgreSQL text cannot hold U+0000: such a name is not kept
log = logging.getLogger("harnessrl.proxy")


async def refuse(serving: Serving, adapter: Adapter, err: ProxyError, ident: Identity | None, admitted: bool,
                 body: Any, client: str | None, t0: float) -> Response:
    """The answer to a refused call. `ident`: its identity, if it was read; `admitted`: its rollout
    is known to be running, so the call is recorded there (else it is counted and logged only);
    `body`: the parsed body, if it was read."""
    call_id = new_call_id()
    current_call.set(call_id)
    body = body if isinstance(body, dict) else {}
    model = body.get("model")
    rec = CallRecord(id=call_id, rollout_id=ident.rollout if ident else None,
                     session_id=ident.session if ident else None, agent=ident.agent if ident else None,
                     parent_call_id=ident.parent_call if ident else None, endpoint=adapter.endpoint,
                     surface=adapter.surface, client=client,
                     model=model[:_MODEL_CHARS] if isinstance(model, str) and not _CONTROL.search(model) else None,
                     stream=body.get("stream") is True, created_at=time.time(),
                     request=body if adapter.surface in _RECORDS_SHAPED or not body else
                     {"harnessrl_surface": {"api": adapter.surface, "body": body}})
    headers = None
    if not admitted:
        rec.status, rec.error = "error", f"{err.status} {err.type}: {err.message}; not recorded"
        rec.latency_ms = (time.perf_counter() - t0) * 1e3
        serving.done(rec, None, False, err.code)
    else:
        err = await serving.fail(rec, err, t0)
        headers = {"x-harnessrl-call": call_id}
    if serving.metrics is not None:
        serving.metrics.refused(adapter.surface, err.status)
    return adapter.error(err, headers)


def user_agent(headers: dict[str, str]) -> str | None:
    """The harness's User-Agent as recorded (`calls.client`, 128 characters)."""
    ua = headers.get("user-agent")
    return ua[:128] if ua else None


def internal_error(exc: BaseException, path: str) -> ProxyError:
    """The 500 for a proxy bug before the call was served: the text may hold SQL or paths, so it
    goes to the log, never into the answer."""
    log.error("internal error on POST %s", path, exc_info=exc)
    return ProxyError(500, f"internal proxy error ({type(exc).__name__}); see the proxy's log", "server_error")
