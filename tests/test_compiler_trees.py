"""Session prefix trees (docs/methods.md §2) on hand-built token arrays."""

import numpy as np
import pytest

from harnessrl.compiler.trees import (
    CallTokens,
    build_forest,
    build_tree,
    infer_parent_calls,
    linear_paths,
    session_key,
)

pytestmark = pytest.mark.unit  # no server, database or training: also run on Python 3.12 in CI


def call(cid, seq, prompt, completion, key="agent:a", agent="a"):
    return CallTokens(cid, seq, key, np.array(prompt, dtype=np.int32), np.array(completion, dtype=np.int32),
                      agent=agent)


def path_mask(tree, path):
    """loss mask of a path built the way the pipeline does: mask 1 on owned completions."""
    leaf = tree.nodes[path.nodes[-1]].call
    mask = np.zeros(leaf.s_len, dtype=np.int8)
    for i, own in zip(path.nodes, path.trainable):
        c = tree.nodes[i].call
        if own:
            mask[len(c.prompt):c.s_len] = 1
    return mask.tolist()


def test_linear_session_extends_and_saves_tokens():
    tree = build_tree("agent:a", [
        call("c0", 0, [1, 2, 3], [4, 5]),
        call("c1", 1, [1, 2, 3, 4, 5, 6, 7], [8]),
        call("c2", 2, [1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11]),
    ])
    assert [n.parent for n in tree.nodes] == [-1, 0, 1]
    assert [n.cause for n in tree.nodes] == ["start", None, None]
    (path,) = linear_paths(tree)
    assert path.nodes == [0, 1, 2] and path.trainable == [True, True, True]
    # completions at positions 3-4 (c0), 7 (c1), 9-10 (c2); prompt tokens and observations 0
    assert path_mask(tree, path) == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    # token saving: Σ|S_c| = 5 + 8 + 11 = 24 over 11 emitted tokens
    recorded = sum(n.call.s_len for n in tree.nodes)
    emitted = sum(tree.nodes[p.nodes[-1]].call.s_len for p in linear_paths(tree))
    assert (recorded, emitted) == (24, 11)


def test_retry_branches_and_shared_tokens_are_trained_once():
    tree = build_tree("agent:a", [
        call("c0", 0, [1, 2], [3]),
        call("c1", 1, [1, 2, 3, 4], [5]),
        call("c2", 2, [1, 2, 3, 4], [6]),  # retry of c1: same context → sibling
    ])
    assert [n.parent for n in tree.nodes] == [-1, 0, 0]
    assert [n.decision_index for n in tree.nodes] == [0, 1, 1]  # the retry is the same turn
    p1, p2 = linear_paths(tree)
    assert (p1.nodes, p1.trainable) == ([0, 1], [True, True])
    assert (p2.nodes, p2.trainable) == ([0, 2], [False, True])
    # c0's token 3 (position 2) trains in the first path only
    assert path_mask(tree, p1) == [0, 0, 1, 0, 1]
    assert path_mask(tree, p2) == [0, 0, 0, 0, 1]


def test_deepest_prefix_among_siblings_and_first_path_by_seq():
    tree = build_tree("agent:a", [
        call("c0", 0, [1], [2]),
        call("c1", 1, [1, 2, 3], [4]),
        call("c2", 2, [1, 2, 3], [4, 5]),  # sibling of c1 whose S is longer
        call("c3", 3, [1, 2, 3, 4, 5, 6], [7]),  # both S_c1 and S_c2 are prefixes: the deeper c2 wins
        call("c4", 4, [1, 2, 3, 4, 8], [9]),  # extends c1
    ])
    assert [n.parent for n in tree.nodes] == [-1, 0, 0, 2, 1]
    paths = linear_paths(tree)
    # depth first, children in seq order: [c0,c1,c4] before [c0,c2,c3]
    assert [p.nodes for p in paths] == [[0, 1, 4], [0, 2, 3]]
    assert [p.trainable for p in paths] == [[True, True, True], [False, True, True]]


def test_new_roots_by_cause():
    tree = build_tree("agent:a", [
        call("c0", 0, [1, 2], [3, 4]),
        call("c1", 1, [1, 2], [5]),  # same prompt as a root: branch (retry of the first turn)
        call("c2", 2, [1, 2, 3, 9, 6], [7]),  # starts with prompt_c0, not with S_c0: drift
        call("c3", 3, [1, 8, 6], [7]),  # compressed history: rewrite
        call("c4", 4, [1, 8, 6, 7, 5], [2]),  # extends the rewritten root
    ])
    assert [n.cause for n in tree.nodes] == ["start", "branch", "drift", "rewrite", None]
    # turns: the branch repeats turn 0; drift and rewrite continue the session (1 + the max so far)
    assert [n.decision_index for n in tree.nodes] == [0, 0, 1, 2, 3]
    assert tree.roots == [0, 1, 2, 3] and tree.nodes[4].parent == 3
    paths = linear_paths(tree)
    assert [p.nodes for p in paths] == [[0], [1], [2], [3, 4]]
    assert all(all(p.trainable) for p in paths)  # no generated token is shared across roots


def test_calls_arrive_out_of_order_and_sessions_are_separate():
    planner = [call("p0", 0, [1, 2], [3], key="agent:planner", agent="planner"),
               call("p1", 3, [1, 2, 3, 20], [21], key="agent:planner", agent="planner")]
    workers = [call("w0", 1, [1, 5], [6], key=session_key("s1", "worker"), agent="worker"),
               call("v0", 2, [1, 5], [7], key=session_key("s2", "worker"), agent="worker"),
               call("w1", 4, [1, 5, 6, 8], [9], key=session_key("s1", "worker"), agent="worker")]
    forest = build_forest(list(reversed(planner + workers)))
    assert [t.key for t in forest] == ["agent:planner", "session:s1", "session:s2"]
    assert [[n.call.call_id for n in t.nodes] for t in forest] == [["p0", "p1"], ["w0", "w1"], ["v0"]]
    assert [n.decision_index for n in forest[0].nodes] == [0, 1]
    # the same prompt in two named sessions does not branch: each session has its own tree
    assert forest[2].nodes[0].cause == "start"
    assert session_key(None, "worker") == "agent:worker" and session_key(None, None) == "agent:default"


def test_inferred_cross_session_edges():
    central = [(0, "p0", ["find the capital of France"]), (5, "p1", ["find the river of Paris"])]
    sessions = [
        ("session:a", 2, "Task: find the capital of France. Main query: ..."),  # after p0, text matches
        ("session:b", 7, "Task: find the river of Paris"),  # after p1
        ("session:c", 3, "Task: unrelated"),  # after p0 but the text does not match
        ("session:d", 6, "find the capital of France"),  # matches p0's text, but p1 came in between
    ]
    assert infer_parent_calls(central, sessions) == {"session:a": "p0", "session:b": "p1"}


def test_unnamed_sub_agent_sessions_count_turns_from_zero():
    def w(cid, seq, prompt, completion, parent=None):
        c = call(cid, seq, prompt, completion, key="agent:worker", agent="worker")
        c.parent_call_id = parent
        return c

    calls = [
        call("p0", 0, [1], [2], key="agent:planner", agent="planner"),  # dispatches worker 1
        w("w0", 1, [50], [51]),
        w("w1", 2, [50, 51, 52], [53]),  # worker 1's turn 1
        w("w2", 3, [60], [61]),  # worker 1 compresses its history: no planner call since → same session
        call("p1", 4, [1, 2, 3], [4], key="agent:planner", agent="planner"),  # dispatches worker 2
        w("v0", 5, [70], [71]),  # a new context after a planner call: worker 2's first call
        w("v1", 6, [70, 71, 72], [73]),
    ]
    trees = build_forest(calls, central="planner")
    assert [t.key for t in trees] == ["agent:planner", "agent:worker", "agent:worker#2"]
    # worker 1: w0 turn 0, w1 turn 1, w2 (rewrite root, same session) turn 2; worker 2 restarts at 0
    assert [(n.call.call_id, n.decision_index) for n in trees[1].nodes] == [("w0", 0), ("w1", 1), ("w2", 2)]
    assert [(n.call.call_id, n.decision_index) for n in trees[2].nodes] == [("v0", 0), ("v1", 1)]
    assert trees[2].nodes[0].cause == "start"
    # without a central agent (or before the fix) v0 continued worker 1's count: turn 3
    legacy = build_forest(calls)
    assert [n.decision_index for n in legacy[1].nodes if n.call.call_id == "v0"] == [3]
    # recorded parent calls decide when present: same parent → the same session even after a
    # planner call; a different parent → a new session with no planner call in between
    same = [calls[0], w("a0", 1, [50], [51], "p0"), calls[4], w("a1", 5, [80], [81], "p0")]
    assert [t.key for t in build_forest(same, central="planner")] == ["agent:planner", "agent:worker"]
    other = [calls[0], w("b0", 1, [50], [51], "p0"), w("b1", 2, [80], [81], "pX")]
    assert [t.key for t in build_forest(other, central="planner")] == ["agent:planner", "agent:worker",
                                                                       "agent:worker#2"]
