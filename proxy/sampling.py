"""The sampling policy on the hot path (`--sampling-policy FILE`; the rules are core's
`harnessrl.sampling_policy`): the body a call is sent with, and what the harness asked, recorded
beside it under `harnessrl_sampling` ({param: {asked, used}})."""

from __future__ import annotations

from harnessrl.proxy.errors import bad_request
from harnessrl.proxy.protocol import Request
from harnessrl.sampling_policy import PolicyViolation, SamplingPolicy, apply


def enforce(policy: SamplingPolicy, call: Request) -> None:
    """Rewrite `call` under `policy` (model calls only: embeddings do not sample); a 400 naming
    the parameter under on_violation: reject."""
    if call.endpoint not in ("chat", "completions"):
        return
    try:
        body, changed = apply(policy, call.body)
    except PolicyViolation as exc:
        raise bad_request(str(exc), param=exc.param, code="sampling_policy") from None
    call.body = body
    if changed:
        call.notes = {**(call.notes or {}), "harnessrl_sampling": changed}
