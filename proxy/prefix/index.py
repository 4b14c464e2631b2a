"""The prefix index: recent calls per (rollout, agent, session), in memory, so that a call
extending an earlier one finds it without a DB query on the hot path.

A conversation grows by a few messages a turn, so each turn stores only what it adds to the
turn it extends (`parent`): its new messages, and its new token ids when its prompt began
with the parent's exact ids. The index is bounded by bytes — its own estimate of what its
turns hold, ancestors kept alive by a descendant included — evicting the least recently used
sessions first.
"""

from __future__ import annotations

import sys
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from harnessrl.messages import content_text
from harnessrl.proxy.prefix.volatile import Volatile

if TYPE_CHECKING:
    from harnessrl.proxy.prefix.rewrites import Rewrites

_TURN_OVERHEAD = 400  # the Turn, its array and deque slot, beyond what _deep_size counts


def _text(content: Any) -> str | None:
    return content_text(content) or None


def _args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


_OPEN, _CLOSE = "<think>", "</think>"


def _content(m: dict, mask: Callable[[str], str] | None) -> Any:
    """A message's text as compared. An assistant's reasoning is part of what the model wrote
    however it comes back: in the content's leading `<think>` block, or moved by the client to
    `reasoning_content` / `reasoning` (litellm, and so mini-swe-agent, does) — compared as (think,
    rest), each without the whitespace around it that clients trim or add when they split."""
    text = _text(m.get("content"))
    if m.get("role") == "assistant":
        r = m.get("reasoning_content") or m.get("reasoning")
        if isinstance(r, str) and r.strip():
            text = _OPEN + r + _CLOSE + (text or "")
        if text is not None and text.startswith(_OPEN):
            # a block the model left open (cut short) is reasoning to the end; the client closes it
            end = text.find(_CLOSE)
            end = len(text) if end < 0 else end
            return ("think", text[len(_OPEN):end].strip(), text[end + len(_CLOSE):].strip() or None)
    return mask(text) if mask is not None and text is not None else text


def _norm(m: dict, mask: Callable[[str], str] | None = None) -> tuple:
    calls = tuple(
        (tc.get("function", tc).get("name"), orjson.dumps(_args(tc.get("function", tc).get("arguments")),
                                                         option=orjson.OPT_SORT_KEYS))
        for tc in (m.get("tool_calls") or []) if isinstance(tc, dict)
    )
    return (m.get("role"), _content(m, mask), calls, m.get("tool_call_id"), m.get("name"))


def same_message(a: dict, b: dict) -> bool:
    """Equal as the model sees them: None/"" content alike, tool-call arguments as JSON values,
    reasoning in the content or beside it, tool-call ids and extra SDK fields ignored."""
    return a == b or _norm(a) == _norm(b)


def _held(new: list[dict], seen: list[dict], volatile: Volatile | None,
          rewrites: Rewrites | None = None) -> list[int] | None:
    """Whether `new` is `seen` (a turn's messages as the model saw them): None if not; else the
    indices of the messages that equal theirs only outside volatile spans, or that are an
    assistant turn the harness rewrote in a form a rewrite rule recognises (to be sent as seen)."""
    if new == seen:
        return []
    held = []
    for i, (a, b) in enumerate(zip(new, seen)):
        if same_message(a, b):
            continue
        if ((volatile is None or _norm(a, volatile.mask) != _norm(b, volatile.mask))
                and (rewrites is None or rewrites.rule_of(a, b) is None)):
            return None
        held.append(i)
    return held


def _deep_size(obj: Any) -> int:
    """Bytes held by a parsed JSON value (dicts, lists, strings, numbers), shared keys counted
    each time: an over- rather than an under-estimate."""
    size, stack = 0, [obj]
    while stack:
        o = stack.pop()
        size += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
    return size


@dataclass(slots=True, eq=False)
class Turn:
    """A recorded call that later calls may extend. Its messages are the parent's messages, the
    parent's reply, then `own`; its exact ids (prompt + completion, int32) are the parent's
    followed by `own_ids` when `ids_from_parent`, else `own_ids` alone."""

    call_id: str
    parent: Turn | None
    own: list[dict]
    n_messages: int
    tools: list | None
    reply: dict  # the assistant message the proxy returned
    own_ids: array
    ids_from_parent: bool
    n_ids: int
    ends_turn: bool  # the completion ended with EOS
    nbytes: int  # what this turn alone holds (the index's estimate)
    refs: int = 0  # index slots and child turns holding it (counted in the index's bytes while > 0)

    @classmethod
    def of(cls, call_id: str, messages: list[dict], tools: list | None, reply: dict, prompt_ids: list[int],
           completion_ids: list[int], eos_ids: frozenset[int] | set[int], parent: Turn | None = None) -> Turn:
        """`parent`: the turn this call was found to extend (its messages + reply begin `messages`)."""
        ends = bool(completion_ids) and completion_ids[-1] in eos_ids
        own = messages[parent.n_messages + 1:] if parent is not None else list(messages)
        if parent is not None:
            tools = parent.tools  # equal (the index matched on it): one copy for the session
        from_parent = parent is not None and parent.starts(prompt_ids)
        own_ids = array("i", prompt_ids[parent.n_ids:] if from_parent else prompt_ids)  # type: ignore[union-attr]
        own_ids.extend(completion_ids)
        nbytes = _TURN_OVERHEAD + 4 * len(own_ids) + _deep_size(own) + _deep_size(reply)
        if parent is None and tools:
            nbytes += _deep_size(tools)
        n_ids = len(own_ids) + (parent.n_ids if from_parent else 0)  # type: ignore[union-attr]
        return cls(call_id, parent, own, len(messages), tools, reply, own_ids, from_parent, n_ids, ends, nbytes)

    @property
    def messages(self) -> list[dict]:
        chain: list[Turn] = []
        t: Turn | None = self
        while t is not None:
            chain.append(t)
            t = t.parent
        out: list[dict] = []
        for t in reversed(chain):
            if t.parent is not None:
                out.append(t.parent.reply)
            out.extend(t.own)
        return out

    @property
    def exact(self) -> array:
        parts = [self.own_ids]
        t = self
        while t.ids_from_parent and t.parent is not None:
            t = t.parent
            parts.append(t.own_ids)
        out = array("i")
        for p in reversed(parts):
            out.extend(p)
        return out

    def starts(self, ids: list[int]) -> bool:
        """Whether `ids` begins with this call's exact prompt + completion ids."""
        n = self.n_ids
        return len(ids) >= n and array("i", ids[:n]) == self.exact


class _Session:
    __slots__ = ("turns", "nbytes")

    def __init__(self) -> None:
        self.turns: deque[Turn] = deque()
        self.nbytes = 0


class PrefixIndex:
    """Recent calls per (rollout, agent, session): up to `per_key` turns a session, `max_bytes` in all."""

    def __init__(self, per_key: int = 8, max_bytes: int = 256 * 1024 * 1024) -> None:
        self._sessions: OrderedDict[tuple, _Session] = OrderedDict()
        self._per_key = per_key
        self.max_bytes = max_bytes
        self.nbytes = 0

    def __contains__(self, key: tuple) -> bool:
        return key in self._sessions

    def add(self, key: tuple, turn: Turn) -> None:
        s = self._sessions.get(key)
        if s is None:
            s = self._sessions[key] = _Session()
        else:
            self._sessions.move_to_end(key)
        s.turns.append(turn)
        self._retain(s, turn)
        if len(s.turns) > self._per_key:
            self._release(s, s.turns.popleft())
        while self.nbytes > self.max_bytes and len(self._sessions) > 1:
            self._drop(next(iter(self._sessions)))
        while self.nbytes > self.max_bytes and len(s.turns) > 1:
            self._release(s, s.turns.popleft())
        if self.nbytes > self.max_bytes:
            self._drop(key)

    def forget(self, rollout_id: str) -> None:
        """Drop a finished rollout's calls."""
        for key in [k for k in self._sessions if k[0] == rollout_id]:
            self._drop(key)

    def find(self, key: tuple, messages: list[dict], tools: list | None) -> Turn | None:
        """The latest call whose messages + reply are the longest prefix of `messages`."""
        return self.match(key, messages, tools)[0]

    def match(self, key: tuple, messages: list[dict], tools: list | None, volatile: Volatile | None = None,
              rewrites: Rewrites | None = None) -> tuple[Turn | None, list[int]]:
        """`find`, where with `volatile` a message may also differ from the turn's inside
        volatile spans, and with `rewrites` an earlier reply may come back rewritten by the
        harness (`prefix/rewrites.py`); and the indices of such messages (the turn's reply at
        `n_messages`). Messages that are equal never reach those checks: they cost nothing to a
        call that extends exactly."""
        s = self._sessions.get(key)
        best: Turn | None = None
        best_held: list[int] = []
        for t in reversed(s.turns if s is not None else ()):
            k = t.n_messages
            if len(messages) <= k or (best is not None and k <= best.n_messages) or t.tools != tools:
                continue
            reply = _held([messages[k]], [t.reply], volatile, rewrites)
            if reply is None:
                continue
            head = _held(messages[:k], t.messages, volatile, rewrites)
            if head is not None:
                best, best_held = t, head + ([k] if reply else [])
        return best, best_held

    def rewritten(self, key: tuple, messages: list[dict], tools: list | None, volatile: Volatile | None,
                  rewrites: Rewrites | None) -> Turn | None:
        """For a call that extends no turn: the latest turn whose messages begin `messages` and
        whose reply comes back as an assistant message the harness wrote itself (a rewrite the
        session cannot be merged through), else None. Asked only of such calls."""
        s = self._sessions.get(key)
        for t in reversed(s.turns if s is not None else ()):
            k = t.n_messages
            if (len(messages) > k and t.tools == tools and messages[k].get("role") == "assistant"
                    and _held([messages[k]], [t.reply], volatile) is None  # not the reply, volatile spans aside
                    and _held(messages[:k], t.messages, volatile, rewrites) is not None):
                return t
        return None

    def _count(self, s: _Session, n: int) -> None:
        s.nbytes += n
        self.nbytes += n

    def _retain(self, s: _Session, t: Turn | None) -> None:
        while t is not None:
            t.refs += 1
            if t.refs > 1:
                return
            self._count(s, t.nbytes)
            t = t.parent

    def _release(self, s: _Session, t: Turn | None) -> None:
        while t is not None:
            t.refs -= 1
            if t.refs > 0:
                return
            self._count(s, -t.nbytes)
            t = t.parent

    def _drop(self, key: tuple) -> None:
        s = self._sessions.pop(key)
        self.nbytes -= s.nbytes
        # an in-flight call may still extend one of these turns: it must count them afresh
        for t in s.turns:
            while t is not None and t.refs:
                t.refs, t = 0, t.parent
