"""Who made a call: rollout, agent, session, parent call.

In order of precedence: the URL path `/r/{rollout}/a/{agent}/v1/...` (a plain `base_url`
carries it), `X-HarnessRL-*` headers, an API key `hrl-<rollout>-<agent>` (for harnesses that
only let you set a URL and a key), sent as `Authorization: Bearer …` or, as the anthropic SDK
does, `x-api-key: …`. With none, the call goes to the "unassigned" rollout.

A call that names neither agent nor session gets an agent name from what it asks
(`unnamed_agent`): its model and a fingerprint of its system prompt, so that one harness's
different agents (Claude Code's main loop, its title side calls and Task sub-agents; an Agents
SDK triage agent and its workers) are told apart in the prefix index and in compile's trees.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from fastapi import Depends, Request

from harnessrl.messages import content_text
from harnessrl.records import UNASSIGNED_ROLLOUT
from harnessrl.proxy.errors import ProxyError, bad_request
from harnessrl.proxy.prefix.volatile import Volatile

KEY_PREFIX = "hrl-"
# the column sizes (harnessrl.records)
_LIMITS = {"rollout": 64, "agent": 128, "session": 128, "parent_call": 64, "call": 64}
_LABEL_LIMITS = {"task_id": 128, "group_id": 128, "run": 128, "name": 64, "version": 128}
# What an id may hold: a value outside it (a NUL, a space, the `:SECRET` of a mistyped key) is
# refused with a 400 before any work, rather than stored or rejected later by the database.
_ID = re.compile(r"[A-Za-z0-9._@+=~-]+")
# Labels (task, group, run, reward name, weight version) are the harness's own free text (the
# training loop's group ids hold a "/"): anything but control characters, which no database
# takes alike (PostgreSQL refuses U+0000 in text), nor unpaired surrogates (not UTF-8).
_LABEL = re.compile(r"[^\x00-\x1f\x7f\ud800-\udfff]*")


@dataclass(frozen=True)
class Identity:
    rollout: str
    agent: str | None
    session: str | None
    parent_call: str | None


def bearer(headers) -> str | None:
    """The API key: `Authorization: Bearer KEY`, else `x-api-key: KEY` (Anthropic's header)."""
    auth = headers.get("authorization")
    if not auth:
        return headers.get("x-api-key") or None
    scheme, _, token = auth.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def split_key(token: str | None, api_key: str | None) -> tuple[str | None, str | None]:
    """(rollout, agent) from an `hrl-<rollout>-<agent>` key; with a proxy --api-key K the
    identity key is `hrl-<rollout>-<agent>:K`."""
    if not token or not token.startswith(KEY_PREFIX):
        return None, None
    body = token[len(KEY_PREFIX):]
    if api_key is not None:
        body, sep, _ = body.rpartition(":")
        if not sep:
            return None, None
    rollout, sep, agent = body.partition("-")
    if not sep or not rollout or not agent:
        return None, None
    return rollout, agent


def check_auth(headers, api_key: str | None) -> None:
    """With --api-key K, a client must send `Bearer K` or `Bearer hrl-<rollout>-<agent>:K` (or
    the same as `x-api-key`)."""
    if api_key is None:
        return
    token = bearer(headers) or ""
    if token.startswith(KEY_PREFIX) and ":" in token:
        token = token.rpartition(":")[2]
    if not hmac.compare_digest(token.encode(), api_key.encode()):
        raise ProxyError(401, "missing or wrong API key", "authentication_error", code="invalid_api_key")


def key_required(api_key: str | None):
    """The FastAPI dependency of the rollout and weights APIs: the key checked as on the hot path."""

    def auth(request: Request) -> None:
        check_auth(request.headers, api_key)

    return Depends(auth)


def identify(path_params: dict, headers, api_key: str | None) -> Identity:
    key_rollout, key_agent = split_key(bearer(headers), api_key)
    rollout = path_params.get("rollout") or headers.get("x-harnessrl-rollout") or key_rollout or UNASSIGNED_ROLLOUT
    agent = path_params.get("agent") or headers.get("x-harnessrl-agent") or key_agent
    ident = Identity(rollout, agent, headers.get("x-harnessrl-session"), headers.get("x-harnessrl-parent-call"))
    for name in ("rollout", "agent", "session", "parent_call"):
        value = getattr(ident, name)
        if value is not None:
            check_id(name, value)
    return ident


def reader_scope(ident: Identity, headers, api_key: str | None) -> str | None:
    """The rollout whose stored responses a request may read and continue: its own (`unassigned`
    when it names none); None, any rollout, for the operator — the proxy's own key, sent as
    itself (not inside an `hrl-` key) by a request that names no rollout. An id from another
    rollout is then answered as one that does not exist (`surfaces.responses.stored`)."""
    if api_key is None or ident.rollout != UNASSIGNED_ROLLOUT:
        return ident.rollout
    token = bearer(headers) or ""
    return None if hmac.compare_digest(token.encode(), api_key.encode()) else ident.rollout


def valid_id(name: str, value: str) -> bool:
    """Whether `value` fits the charset and length of a `name` id (rollout, agent, call, ...)."""
    return len(value) <= _LIMITS[name] and _ID.fullmatch(value) is not None


def check_id(name: str, value: str, param: str | None = None) -> None:
    """400 unless `value` fits the charset and length of a `name` id (rollout, agent, ...)."""
    limit = _LIMITS[name]
    if len(value) > limit:
        raise bad_request(f"{name} id is longer than {limit} characters", param, code="identity_too_long")
    if not _ID.fullmatch(value):
        # the value is not echoed: it may be a secret sent in the wrong place
        raise bad_request(f"{name} id may only hold letters, digits and . _ @ + = ~ -", param,
                          code="invalid_identity")


def check_labels(**labels: str | None) -> None:
    """Free-text labels of the rollout API (`task_id`, `group_id`, `run`, reward `name`, weight
    `version`): no control characters, no longer than their column."""
    for name, value in labels.items():
        if value is None:
            continue
        limit = _LABEL_LIMITS[name]
        if len(value) > limit:
            raise bad_request(f"'{name}' is longer than {limit} characters", param=name, code="value_too_long")
        if not _LABEL.fullmatch(value):
            raise bad_request(f"'{name}' may not hold control characters (such as U+0000)", param=name,
                              code="invalid_value")


_NOT_ID = re.compile(r"[^A-Za-z0-9._+=~-]+")


def unnamed_agent(ident: Identity, body: dict[str, Any], volatile: Volatile) -> Identity:
    """`ident` with an agent named after the call (explicit names always win: only a call with
    neither agent nor session is named here). The name is the model's (`openai/gpt-4o` →
    `openai-gpt-4o`), and, when the call has a system prompt, `@` and 4 hex digits of it with its
    volatile spans masked — so it is deterministic, the same for every call of one agent's
    session whatever the harness stamps into it, and different for agents whose instructions
    differ. Valid as an explicit agent id too, so a name seen in the records can be passed back."""
    system = []
    for m in body.get("messages") or ():
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer"):
            break
        system.append(content_text(m.get("content")))
    model = body.get("model")
    name = _name(model if isinstance(model, str) else "", "\n".join(system) if system else None, volatile)
    return Identity(ident.rollout, name, ident.session, ident.parent_call)  # (dataclasses.replace: 3x slower)


@lru_cache(maxsize=256)
def _name(model: str, system: str | None, volatile: Volatile) -> str:
    # cached: a harness sends the same system prompt call after call (masking and hashing it is
    # ~10 µs of the hot path); one that stamps a new value each time only misses
    name = _NOT_ID.sub("-", model)[:100].strip("-") or "model"
    return name if system is None else name + "@" + volatile.fingerprint(system)
