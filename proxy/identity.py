"""Who made a call: rollout, agent, session, parent call.

In order of precedence: the URL path `/r/{rollout}/a/{agent}/v1/...` (a plain `base_url`
carries it), `X-HarnessRL-*` headers, an API key `hrl-<rollout>-<agent>` (for harnesses that
only let you set a URL and a key), sent as `Authorization: Bearer …` or, as the anthropic SDK
does, `x-api-key: …`. With none, the call goes to the "unassigned" rollout.

Who may do what (docs/proxy.md, "Keys"): with --api-key K, K is the operator's key and is taken on
every route (also inside a key, `hrl-<rollout>-<agent>:K`, as before). A rollout's key,
`hrl-<rollout>-<agent>:rk_<HMAC(K, rollout)>`, is minted by the proxy when the operator creates the
rollout: stateless (any proxy with K checks it), it grants that rollout's model calls and the few
rollout routes its harness may need (`check_scope`), never another rollout's nor the operator's.

A call that names neither agent nor session gets an agent name from what it asks
(`unnamed_agent`): its model and a fingerprint of its system prompt, so that one harness's
different agents (Claude Code's main loop, its title side calls and Task sub-agents; an Agents
SDK triage agent and its workers) are told apart in the prefix index and in compile's trees.
"""

from __future__ import annotations

import hashlib
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
    identity key is `hrl-<rollout>-<agent>:K` or the rollout's own `hrl-<rollout>-<agent>:rk_…`."""
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


def rollout_tag(api_key: str, rollout: str) -> str:
    """The secret part of rollout `rollout`'s key: an HMAC of its id under the operator's key."""
    mac = hmac.new(api_key.encode(), b"harnessrl rollout key\0" + rollout.encode(), hashlib.sha256)
    return "rk_" + mac.hexdigest()[:32]


def rollout_key(api_key: str | None, rollout: str, agent: str) -> str:
    """The key that grants `rollout`'s calls as `agent` (any agent of the rollout may use it: the
    HMAC binds the rollout only). Without --api-key the proxy checks no key: the bare identity."""
    ident = f"{KEY_PREFIX}{rollout}-{agent}"
    return ident if api_key is None else f"{ident}:{rollout_tag(api_key, rollout)}"


def rollout_base_path(api_key: str | None, rollout: str) -> str:
    """A rollout's base URL path, `{agent}` to fill in. With a key, `/k/<tag>/r/<rollout>/a/{agent}/v1`:
    the rollout's key rides in the URL (`key_in_path`), so a harness that sets only a base URL and
    sends a key of its own ("unused", a real vendor key) still makes its rollout's calls."""
    path = f"/r/{rollout}/a/{{agent}}/v1"
    return path if api_key is None else f"/k/{rollout_tag(api_key, rollout)}{path}"


_KEYED = re.compile(r"^/k/(?P<tag>[^/]+)(?P<rest>/r/(?P<rollout>[^/]+)/a/(?P<agent>[^/]+)/.*)$")


def key_in_path(scope: dict) -> dict:
    """The ASGI scope of a request to `/k/<tag>/r/<rollout>/a/<agent>/...` (`rollout_base_path`)
    as if sent to `/r/<rollout>/a/<agent>/...` with the key `hrl-<rollout>-<agent>:<tag>` (any key
    of its own dropped); any other scope as it is. The key is then checked like any other."""
    m = _KEYED.match(scope["path"])
    if m is None:
        return scope
    key = f"Bearer {KEY_PREFIX}{m['rollout']}-{m['agent']}:{m['tag']}".encode()
    headers = [(k, v) for k, v in scope["headers"] if k not in (b"authorization", b"x-api-key")]
    return {**scope, "path": m["rest"], "raw_path": m["rest"].encode(), "headers": [*headers, (b"authorization", key)]}


_WRONG = False  # `_key_scope` of a key that is neither the operator's nor a rollout's


@lru_cache(maxsize=4096)
def _key_scope(token: str, api_key: str) -> str | None | bool:
    # cached: the same key comes call after call, and the HMAC is ~2 µs of the hot path
    if hmac.compare_digest(token.encode(), api_key.encode()):
        return None
    if token.startswith(KEY_PREFIX):
        body, sep, tag = token[len(KEY_PREFIX):].rpartition(":")
        if sep:
            if hmac.compare_digest(tag.encode(), api_key.encode()):
                return None  # `hrl-<rollout>-<agent>:K`: the operator naming an identity
            rollout = body.partition("-")[0]
            if rollout and hmac.compare_digest(tag.encode(), rollout_tag(api_key, rollout).encode()):
                return rollout
    return _WRONG


def check_auth(headers, api_key: str | None) -> str | None:
    """The scope of the request's key: None for the operator (the proxy's --api-key K, sent as
    itself or as `hrl-<rollout>-<agent>:K`; or any request when the proxy has no key), else the
    rollout whose key it is. 401 for a missing or wrong key."""
    if api_key is None:
        return None
    scope = _key_scope(bearer(headers) or "", api_key)
    if scope is _WRONG:
        raise ProxyError(401, "missing or wrong API key", "authentication_error", code="invalid_api_key")
    return scope  # type: ignore[return-value]


def check_scope(scope: str | None, rollout: str) -> None:
    """403 unless a request with key scope `scope` may act for `rollout` (the ids are checked ones)."""
    if scope is not None and scope != rollout:
        raise ProxyError(403, f"this key is rollout {scope!r}'s: it grants that rollout's calls only, not "
                              f"rollout {rollout!r}'s", "permission_error", code="rollout_key_scope")


def operator_only(headers, api_key: str | None) -> None:
    """401 for a wrong key, 403 for a rollout's key: the route is the operator's."""
    if check_auth(headers, api_key) is not None:
        raise ProxyError(403, "this route needs the proxy's operator key (--api-key): a rollout's key grants "
                              "its own model calls only", "permission_error", code="operator_key_required")


def key_required(api_key: str | None):
    """The FastAPI dependency of the operator's routes (create and list rollouts, weights)."""

    def auth(request: Request) -> None:
        operator_only(request.headers, api_key)

    return Depends(auth)


def key_scope(api_key: str | None):
    """The FastAPI dependency of the routes a rollout's key may also call: the key's scope."""

    def scope(request: Request) -> str | None:
        return check_auth(request.headers, api_key)

    return Depends(scope)


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
    if (name, value) in _CHECKED:  # the same ids come call after call: each is checked once
        return
    limit = _LIMITS[name]
    if len(value) > limit:
        raise bad_request(f"{name} id is longer than {limit} characters", param, code="identity_too_long")
    if not _ID.fullmatch(value):
        # the value is not echoed: it may be a secret sent in the wrong place
        raise bad_request(f"{name} id may only hold letters, digits and . _ @ + = ~ -", param,
                          code="invalid_identity")
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED.add((name, value))


# ids found valid (a bounded set: cleared when full, so a flood of new ids costs only their checks)
_CHECKED: set[tuple[str, str]] = set()
_CHECKED_MAX = 4096


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
