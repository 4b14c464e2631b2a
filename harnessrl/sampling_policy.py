"""The sampling policy: parameters the proxy enforces on every call so that recorded samples
stay on-policy whatever the harness sends (`harnessrl proxy --sampling-policy FILE`), and the
check compile makes on recorded calls (`harnessrl compile --sampling-policy FILE`).

RL's importance ratios assume the behaviour policy is the model's own distribution: a harness
that samples at temperature 0.2, with a `logit_bias` or a repetition penalty, produces tokens
(and log-probs) of another distribution. The policy file is YAML whose keys are the fields of
`SamplingPolicy`, for example:

    temperature: 1.0
    top_p: 1.0
    max_tokens: 2048          # a cap; also set when the harness sends none
    forbid: [logit_bias, presence_penalty, frequency_penalty]
    defaults: {seed: null}
    on_violation: override    # or reject: a 400 naming the parameter

Core: the proxy applies it (`apply`), the compiler checks recorded calls (`violations`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from harnessrl.errors import UserError

# what an OpenAI-compatible server uses when a parameter is absent (vLLM: unless the model's
# generation_config says otherwise, which is why the proxy sets enforced values explicitly)
API_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                                "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
ENFORCEABLE = tuple(API_DEFAULTS)
_MAX_KEYS = ("max_tokens", "max_completion_tokens")


@dataclass
class SamplingPolicy:
    temperature: float | None = field(default=None, metadata={"help": "Sampling temperature every call uses "
                                      "(None: the harness's own)."})
    top_p: float | None = field(default=None, metadata={"help": "Nucleus mass every call uses."})
    top_k: int | None = field(default=None, metadata={"help": "Top-k every call uses (-1: off; vLLM)."})
    min_p: float | None = field(default=None, metadata={"help": "Min-p every call uses (0: off; vLLM)."})
    presence_penalty: float | None = field(default=None, metadata={"help": "Presence penalty every call uses."})
    frequency_penalty: float | None = field(default=None, metadata={"help": "Frequency penalty every call uses."})
    repetition_penalty: float | None = field(default=None, metadata={"help": "Repetition penalty every call "
                                             "uses (1: off; vLLM)."})
    max_tokens: int | None = field(default=None, metadata={"help": "Cap on max_tokens / max_completion_tokens; "
                                   "also set when the harness sends neither."})
    forbid: list[str] = field(default_factory=list, metadata={"help": "Parameters removed from every call "
                              "(e.g. logit_bias)."})
    defaults: dict[str, Any] = field(default_factory=dict, metadata={"help": "Parameters set when the harness "
                                     "does not send them (not enforced: a value it sends is kept)."})
    on_violation: str = field(default="override", metadata={"help": "A value the harness sent that breaks the "
                              "policy: override (use the policy's, record both) | reject (400)."})

    def enforced(self) -> dict[str, Any]:
        """The parameters set to a fixed value on every call."""
        return {k: getattr(self, k) for k in ENFORCEABLE if getattr(self, k) is not None}


def parse_policy(data: Any, source: str = "sampling policy") -> SamplingPolicy:
    """A policy from its YAML/JSON mapping; a one-line UserError for anything else."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of {', '.join(f.name for f in fields(SamplingPolicy))}")
    known = {f.name for f in fields(SamplingPolicy)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"{source}: unknown key(s) {', '.join(map(str, unknown))} (known: {', '.join(sorted(known))})")
    p = SamplingPolicy(**data)
    for k, v in p.enforced().items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise UserError(f"{source}: {k} must be a number, got {v!r}")
    if p.max_tokens is not None and (isinstance(p.max_tokens, bool) or not isinstance(p.max_tokens, int)
                                     or p.max_tokens < 1):
        raise UserError(f"{source}: max_tokens must be a positive integer, got {p.max_tokens!r}")
    if not (isinstance(p.forbid, list) and all(isinstance(k, str) for k in p.forbid)):
        raise UserError(f"{source}: forbid must be a list of parameter names")
    if not isinstance(p.defaults, dict):
        raise UserError(f"{source}: defaults must be a mapping of parameter: value")
    if p.on_violation not in ("override", "reject"):
        raise UserError(f"{source}: on_violation must be 'override' or 'reject', got {p.on_violation!r}")
    return p


def load_policy(path: str | Path) -> SamplingPolicy:
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UserError(f"--sampling-policy: cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"--sampling-policy {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return parse_policy(data, f"--sampling-policy {path}")


class PolicyViolation(ValueError):
    """A parameter the harness sent that the policy forbids (under on_violation: reject)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def apply(policy: SamplingPolicy, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict]]:
    """The body to send under `policy`, and what changed: {param: {"asked": value or None (not
    sent), "used": value or None (removed)}}. Raises PolicyViolation under on_violation: reject
    for a value the harness sent that breaks the policy (an absent one is set, never refused)."""
    out = dict(body)
    changed: dict[str, dict] = {}

    def use(k: str, value: Any, sent_breaks: bool) -> None:
        if sent_breaks and policy.on_violation == "reject":
            raise PolicyViolation(k, f"'{k}' {body[k]!r} breaks the sampling policy ({_rule(policy, k)})")
        changed[k] = {"asked": body.get(k), "used": value}
        if value is None:
            out.pop(k, None)
        else:
            out[k] = value

    for k, v in policy.enforced().items():
        if k not in body or body[k] is None or body[k] != v:
            use(k, v, body.get(k) is not None)
    if policy.max_tokens is not None:
        asked = [k for k in _MAX_KEYS if body.get(k) is not None]
        for k in asked:
            if isinstance(body[k], int) and body[k] > policy.max_tokens:
                use(k, policy.max_tokens, True)
        if not asked:
            use("max_tokens", policy.max_tokens, False)
    for k in policy.forbid:
        if k in body:
            use(k, None, body[k] is not None)
    for k, v in policy.defaults.items():
        if k not in body:
            use(k, v, False)
    return out, changed


def _rule(policy: SamplingPolicy, k: str) -> str:
    if k in policy.forbid:
        return "forbidden"
    if k in _MAX_KEYS:
        return f"at most {policy.max_tokens}"
    return f"must be {getattr(policy, k)!r}"


def violations(policy: SamplingPolicy, request: dict[str, Any]) -> list[str]:
    """How a recorded call's request (the parameters it was sampled with) breaks `policy`: one
    short reason per parameter, none when it is on-policy. An absent parameter counts as the
    API's default; an absent max_tokens as uncapped."""
    out = []
    for k, v in policy.enforced().items():
        used = request.get(k)
        used = API_DEFAULTS[k] if used is None else used
        if used != v:
            out.append(f"{k}={used!r} (policy {v!r})")
    if policy.max_tokens is not None:
        caps = [request[k] for k in _MAX_KEYS if request.get(k) is not None]
        if not caps:
            out.append(f"max_tokens unset (policy at most {policy.max_tokens})")
        elif any(not isinstance(c, int) or c > policy.max_tokens for c in caps):
            out.append(f"max_tokens={caps[0]!r} (policy at most {policy.max_tokens})")
    out.extend(f"{k} sent (forbidden)" for k in policy.forbid if request.get(k) is not None)
    return out
