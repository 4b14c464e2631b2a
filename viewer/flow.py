"""A rollout's calls laid out for reading long sessions (docs/viewer.md, "Long sessions").

Each session (the harness's session id, else the agent) is a flat list of rows, not a nested
tree: a call that extends the previous one is drawn at the same level, so a 100-turn chain is
100 rows of equal indentation instead of a 100-step staircase. Indentation marks forks only:
at a call with several continuations — and among a session's roots — the one with the most
calls below it (the later on a tie) is the session's spine and stays at the level of its
parent; every other continuation or root (a retried turn, parallel samples, an abandoned
context) is drawn one level deeper. Roots that are all single calls (a title agent's one-shot
calls) are a plain list. Depth is capped at MAX_DEPTH for drawing.

A call's parent is its parent in the compiler's prefix tree when it has token ids. A call
without them (refused or failed, a text-only upstream, a stream without ids) extends the
earlier call of its session whose messages (system prompts aside: `conversation`) are the
longest strict prefix of its own, so errors and hosted-model sessions (Claude Code, Codex
through an upstream) sit in the chain where they happened.

The main agent is the one named `main` when there is one, else the agent with the most calls
(ties: the most prompt + completion tokens, then the earlier first call). Sessions of other
agents (title and summary calls, sub-agents) are side calls, folded on the page.
"""

from __future__ import annotations

from typing import Any

from harnessrl.compiler.trees import SessionTree, session_key

MAX_DEPTH = 8  # drawing levels (viewer.css .d0 … .d8); deeper forks are labelled with their depth
OPEN_UP_TO = 12  # a session with at most this many calls shows every call's body open


def agent_name(agent: str | None) -> str:
    return agent or "default"


def main_agent(calls: list[Any]) -> str | None:
    """The rollout's main agent (module docstring); None without calls."""
    stats: dict[str, list[int]] = {}
    for c in calls:  # seq order: the first seen has the earliest first call
        s = stats.setdefault(agent_name(c.agent), [0, 0, -c.seq])
        s[0] += 1
        s[1] += (c.prompt_tokens or 0) + (c.completion_tokens or 0)
    if "main" in stats:
        return "main"
    return max(stats, key=lambda a: tuple(stats[a])) if stats else None


def _message_parent(messages: list[Any], earlier: list[tuple[Any, list[Any]]]) -> str | None:
    """The earlier call whose messages are the longest strict prefix of `messages`; among
    equals (a retried turn) an ok one, then the later. Tried best first, so in a linear session
    the previous call answers at once."""
    ranked = sorted(earlier, key=lambda e: (len(e[1]), e[0].status == "ok", e[0].seq), reverse=True)
    for call, theirs in ranked:
        n = len(theirs)
        if 0 < n < len(messages) and messages[:n] == theirs:
            return call.id
    return None


def conversation(messages: list[Any]) -> list[Any]:
    """The messages a prefix is looked for in: all but system and developer ones, which a
    harness may rewrite on every call (Claude Code's system prompt starts with a billing header
    whose `cch=` hash changes per request) without starting another conversation."""
    return [m for m in messages if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))]


def _parents(members: list[Any], forest_parent: dict[str, str | None], forest_cause: dict[str, str | None],
             messages: dict[str, list[Any]]) -> tuple[dict[str, str | None], dict[str, str | None]]:
    parent: dict[str, str | None] = {}
    cause: dict[str, str | None] = {}
    if all(c.id in forest_parent for c in members):  # every call in the token tree: no messages to compare
        return {c.id: forest_parent[c.id] for c in members}, {c.id: forest_cause[c.id] for c in members}
    earlier: list[tuple[Any, list[Any]]] = []
    for c in members:
        mine = conversation(messages[c.id])
        if c.id in forest_parent:
            parent[c.id], cause[c.id] = forest_parent[c.id], forest_cause[c.id]
        else:
            p = _message_parent(mine, earlier)
            parent[c.id] = p
            if p is not None:
                cause[c.id] = None
            elif not earlier:
                cause[c.id] = "start"
            elif any(parent[e.id] is None and theirs == mine for e, theirs in earlier):
                cause[c.id] = "branch"  # the first turn again (the compiler's word for it)
            else:
                cause[c.id] = "rewrite"
        earlier.append((c, mine))
    return parent, cause


def _rows(members: list[Any], parent: dict[str, str | None], cause: dict[str, str | None]) -> list[dict[str, Any]]:
    """Pre-order rows, children in seq order; the spine child keeps its parent's depth."""
    seq = {c.id: c.seq for c in members}
    children: dict[str | None, list[str]] = {}
    for c in members:
        children.setdefault(parent[c.id], []).append(c.id)
    size = dict.fromkeys(seq, 1)
    for c in reversed(members):  # parents come before their children in seq order
        if parent[c.id] is not None:
            size[parent[c.id]] += size[c.id]  # type: ignore[index]
    turn: dict[str, int] = {}
    for c in members:  # the compiler's turn rule: a rewritten context continues the count
        p = parent[c.id]
        turn[c.id] = (turn[p] + 1 if p is not None else 0 if cause[c.id] in ("start", "branch")
                      else 1 + max(turn.values(), default=-1))

    def ordered(kids: list[str], depth: int) -> list[tuple[str, int]]:
        spine = max(kids, key=lambda k: (size[k], seq[k]))
        if depth < 0:  # the roots: one-shot calls (a title agent's) are a list, not forks
            return [(k, 0 if k == spine or size[spine] == 1 else 1) for k in kids]
        return [(k, depth if k == spine else depth + 1) for k in kids]

    rows: list[dict[str, Any]] = []
    depth_of: dict[str | None, int] = {None: 0}
    stack = list(reversed(ordered(children[None], -1)))
    while stack:
        cid, depth = stack.pop()
        p = parent[cid]
        depth_of[cid] = depth
        # right below its parent, which has no other continuation: the plain chain (drawn quieter)
        chain = bool(rows) and rows[-1]["call"] == p and len(children[p]) == 1
        rows.append({"call": cid, "depth": depth, "draw": min(depth, MAX_DEPTH), "parent": p, "cause": cause[cid],
                     "turn": turn[cid], "fork": len(children[p]) > 1, "side": depth > depth_of[p], "chain": chain,
                     "below": size[cid] - 1})
        stack.extend(reversed(ordered(children[cid], depth)) if cid in children else ())
    return rows


def sessions(calls: list[Any], forest: list[SessionTree], messages: dict[str, list[Any]]) -> dict[str, Any]:
    """{main_agent, sessions: [{key, anchor, agent, session_id, main, open, dispatched_by, calls,
    errors, tokens, max_depth, rows: [{call, depth, draw, parent, cause, turn, fork, side, chain, below}]}],
    dispatches: {call id: [{anchor, key, calls}]}}; `calls` in seq order, `messages`: each
    call's request messages."""
    main = main_agent(calls)
    forest_parent: dict[str, str | None] = {}
    forest_cause: dict[str, str | None] = {}
    for tree in forest:
        for node in tree.nodes:
            cid = node.call.call_id
            forest_parent[cid] = tree.nodes[node.parent].call.call_id if node.parent >= 0 else None
            forest_cause[cid] = node.cause
    groups: dict[str, list[Any]] = {}
    for c in calls:
        groups.setdefault(session_key(c.session_id, c.agent), []).append(c)
    out: list[dict[str, Any]] = []
    dispatches: dict[str, list[dict[str, Any]]] = {}
    for i, (key, members) in enumerate(groups.items(), 1):
        parent, cause = _parents(members, forest_parent, forest_cause, messages)
        rows = _rows(members, parent, cause)
        first = members[0]
        s = {"key": key, "anchor": f"session-{i}", "agent": agent_name(first.agent), "session_id": first.session_id,
             "main": agent_name(first.agent) == main, "open": len(members) <= OPEN_UP_TO,
             "dispatched_by": first.parent_call_id, "calls": len(members),
             "errors": sum(c.status != "ok" for c in members),
             "tokens": sum(c.completion_tokens or 0 for c in members),
             "max_depth": max(r["depth"] for r in rows), "rows": rows}
        out.append(s)
        if first.parent_call_id:
            dispatches.setdefault(first.parent_call_id, []).append(
                {"anchor": s["anchor"], "key": key, "calls": len(members)})
    return {"main_agent": main, "sessions": out, "dispatches": dispatches}


def same_tools(calls: list[Any]) -> dict[str, str]:
    """{call id: the previous call of its session that sent the very same tool schemas}: the
    page shows a session's schemas when they change, not once per call (a coding agent sends
    tens of kilobytes of them with every call)."""
    last: dict[str, Any] = {}
    out: dict[str, str] = {}
    for c in calls:
        key = session_key(c.session_id, c.agent)
        tools = c.request.get("tools") if isinstance(c.request, dict) else None
        if tools and key in last and isinstance(last[key].request, dict) and last[key].request.get("tools") == tools:
            out[c.id] = out.get(last[key].id, last[key].id)
        last[key] = c
    return out
