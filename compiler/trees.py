"""Session prefix trees over token arrays (docs/methods.md §2).

Per rollout and session key (the harness's session id, else the agent name), calls are inserted
in `seq` order. A call extends the deepest earlier node (the longest `S = prompt ⧺ completion`)
whose S is an exact prefix of its prompt; calls from the same context become siblings; anything else starts
a new root (never spliced). Every root-to-leaf path is one linear sample; a node's generated
tokens are trainable only in the first path through it (paths ordered depth-first, children in
`seq` order, i.e. lexicographically by the seqs along the path).

Prefix search tries the earlier nodes longest-S first: in a linear session the previous call
matches at once, so each call costs one numpy comparison of its prompt.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

# causes of a root: the session's first call, a sibling of an earlier root (same prompt: a
# retry or a parallel call of the first turn), template drift, rewritten/compressed history
ROOT_CAUSES = ("start", "branch", "drift", "rewrite")


@dataclass
class CallTokens:
    call_id: str
    seq: int
    key: str  # session key: session id when named, else agent
    prompt: np.ndarray  # int32
    completion: np.ndarray  # int32
    logprobs: np.ndarray | None = None  # float32, one per completion token
    agent: str | None = None
    session_id: str | None = None
    parent_call_id: str | None = None
    weight_version: str | None = None
    retokenized: bool = False
    finish_reason: str | None = None  # "length": cut by max_tokens (see --mask-truncated)
    s_len: int = field(init=False)  # |S| = |prompt| + |completion|

    def __post_init__(self) -> None:
        self.s_len = len(self.prompt) + len(self.completion)


@dataclass
class Node:
    call: CallTokens
    parent: int  # index in SessionTree.nodes, -1 for a root
    cause: str | None  # root cause (ROOT_CAUSES), None for attached nodes
    decision_index: int  # the turn: parent's + 1; 0 for a first call; after a rewrite, the session's next
    children: list[int] = field(default_factory=list)


@dataclass
class SessionTree:
    key: str
    nodes: list[Node] = field(default_factory=list)
    roots: list[int] = field(default_factory=list)
    by_length: list[int] = field(default_factory=list)  # node indices, longest S first
    neg_lengths: list[int] = field(default_factory=list)  # −|S| of by_length, for bisect

    def s_tokens(self, i: int) -> np.ndarray:
        c = self.nodes[i].call
        return np.concatenate([c.prompt, c.completion])


@dataclass
class LinearPath:
    nodes: list[int]  # root first
    trainable: list[bool]  # per node: does this path own the node's generated tokens


def _s_is_prefix(c: CallTokens, prompt: np.ndarray) -> bool:
    lp, ls = len(c.prompt), c.s_len
    return (
        ls <= len(prompt)
        and prompt[lp:ls].tobytes() == c.completion.tobytes()  # the short part first: a cheap reject
        and prompt[:lp].tobytes() == c.prompt.tobytes()
    )


def _deepest_prefix(tree: SessionTree, prompt: np.ndarray) -> int:
    """The node with the longest S that is a prefix of `prompt`, or -1. Nodes are tried
    longest first, so a linear session costs one comparison per call."""
    start = bisect.bisect_left(tree.neg_lengths, -len(prompt))  # skip S longer than the prompt
    for i in tree.by_length[start:]:
        if _s_is_prefix(tree.nodes[i].call, prompt):
            return i
    return -1


def _root_cause(tree: SessionTree, prompt: np.ndarray) -> str:
    if not tree.nodes:
        return "start"
    if any(np.array_equal(tree.nodes[r].call.prompt, prompt) for r in tree.roots):
        return "branch"
    for node in reversed(tree.nodes):
        p = node.call.prompt
        if len(p) <= len(prompt) and np.array_equal(prompt[: len(p)], p):
            return "drift"  # the harness kept the context but re-rendered the completion
    return "rewrite"


def _insert(tree: SessionTree, call: CallTokens) -> None:
    parent = _deepest_prefix(tree, call.prompt)
    idx = len(tree.nodes)
    if parent >= 0:
        tree.nodes.append(Node(call, parent, None, tree.nodes[parent].decision_index + 1))
        tree.nodes[parent].children.append(idx)
    else:
        cause = _root_cause(tree, call.prompt)
        # a retry of the first turn is turn 0 again; a rewritten context continues the session
        index = 0 if cause in ("start", "branch") else 1 + max(n.decision_index for n in tree.nodes)
        tree.nodes.append(Node(call, -1, cause, index))
        tree.roots.append(idx)
    at = bisect.bisect_right(tree.neg_lengths, -call.s_len)
    tree.by_length.insert(at, idx)
    tree.neg_lengths.insert(at, -call.s_len)


def build_tree(key: str, calls: list[CallTokens]) -> SessionTree:
    """Insert one session's calls (any order; sorted by seq here) into a prefix tree."""
    tree = SessionTree(key)
    for call in sorted(calls, key=lambda c: c.seq):
        _insert(tree, call)
    return tree


def _new_unnamed_session(tree: SessionTree, call: CallTokens, central_since: bool) -> bool:
    """Does this call of an unnamed sub-agent start a new session rather than continue (or
    compress) the current one? Only a call that would be a rewrite root can; it does when its
    recorded parent call differs from the session's, or, with no parent recorded, when the
    central agent made a call since this agent's previous one (it dispatched again)."""
    if _deepest_prefix(tree, call.prompt) >= 0 or _root_cause(tree, call.prompt) != "rewrite":
        return False
    parent = tree.nodes[0].call.parent_call_id
    if call.parent_call_id and parent:
        return call.parent_call_id != parent
    return central_since


def build_forest(calls: list[CallTokens], central: str | None = None) -> list[SessionTree]:
    """One tree per session of a rollout, in order of their first call. A session is the key
    (session id, else agent); calls of a sub-agent (not `central`) without a session id are
    split into one session per dispatch (keys `agent:NAME`, `agent:NAME#2`, …), so each
    worker's turns count from 0."""
    current: dict[str, SessionTree] = {}
    trees: list[SessionTree] = []
    count: dict[str, int] = {}
    last_seq: dict[str, int] = {}
    last_central = -1
    for c in sorted(calls, key=lambda c: c.seq):
        tree = current.get(c.key)
        if (tree is not None and central is not None and c.session_id is None and c.agent != central
                and _new_unnamed_session(tree, c, last_central > last_seq[c.key])):
            count[c.key] = count.get(c.key, 1) + 1
            tree = None
        if tree is None:
            n = count.get(c.key, 1)
            tree = current[c.key] = SessionTree(c.key if n == 1 else f"{c.key}#{n}")
            trees.append(tree)
        _insert(tree, c)
        last_seq[c.key] = c.seq
        if c.agent == central:
            last_central = c.seq
    return trees


def linear_paths(tree: SessionTree) -> list[LinearPath]:
    """Root-to-leaf paths, depth-first with children in seq order; the first path through a
    node owns its generated tokens."""
    out: list[LinearPath] = []
    owned: set[int] = set()
    stack: list[tuple[int, list[int]]] = [(r, []) for r in reversed(tree.roots)]
    while stack:
        i, prefix = stack.pop()
        path = prefix + [i]
        children = tree.nodes[i].children
        if children:
            stack.extend((ch, path) for ch in reversed(children))
            continue
        trainable = [n not in owned for n in path]
        owned.update(path)
        out.append(LinearPath(path, trainable))
    return out


def session_key(session_id: str | None, agent: str | None) -> str:
    if session_id:
        return f"session:{session_id}"
    return f"agent:{agent or 'default'}"


def infer_parent_calls(
    central: list[tuple[int, str, list[str]]],
    sessions: list[tuple[str, int, str]],
) -> dict[str, str]:
    """Cross-session edges for sessions with no `parent_call_id` (docs/methods.md §2).

    `central`: (seq, call_id, dispatched sub-task texts) of the central agent's calls;
    `sessions`: (session key, seq of its first call, its first user message text).
    A session's parent is the last central call before its first call, if that call
    dispatched a sub-task whose text the session's first user message contains.
    """
    ordered = sorted(central)
    edges: dict[str, str] = {}
    for key, first_seq, first_user in sessions:
        before = [c for c in ordered if c[0] < first_seq]
        if not before:
            continue
        _, call_id, texts = before[-1]
        if any(t and t in first_user for t in texts):
            edges[key] = call_id
    return edges
