"""Stage 4 of `harnessrl compile`: a rollout's session trees → linear samples (docs/methods.md §2).

Every root-to-leaf path is one sample: the leaf's `prompt ⧺ completion`, mask 1 and the unit's
classes and advantage on the completions this path owns (`trees.linear_paths`), the recorded
behaviour log-probs where they cover the completion, and the turn index on every generated
span. Cost: O(tokens of the sample) numpy slicing per path.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from harnessrl.compiler.reader import RolloutWork
from harnessrl.samples import CLASS_NAMES
from harnessrl.compiler.scoring import trained
from harnessrl.compiler.trees import SessionTree, linear_paths


def tree_stats(w: RolloutWork) -> None:
    """Sessions, recorded tokens, merges and roots by cause, into `w.stats`."""
    s = w.stats
    for tree in w.trees:
        s["sessions"] += 1
        for node in tree.nodes:
            s["tokens_recorded"] += node.call.s_len
            if node.parent >= 0:
                s["merges"] += 1
            else:
                s[f"roots_{node.cause}"] += 1


def emit(w: RolloutWork, add: Callable[[dict[str, Any]], int], train_agents: str, advantage: str,
         mask_truncated: bool = False, off_policy: frozenset[str] = frozenset(), policy_action: str = "drop") -> None:
    """The rollout's samples of the trained agents, each passed to `add` (returns its tokens).
    `mask_truncated`: a path that ends in a call cut by max_tokens — the session never finished
    that turn — trains nothing on that last turn (counted as `masked_truncated`).
    `off_policy`: ids of calls sampled against the sampling policy; a path that trains on one is
    left out (`drop`, counted as `policy_dropped`), trains nothing on those turns (`mask`,
    `policy_masked` turns) or is kept and counted (`flag`, `policy_flagged`)."""
    s = w.stats
    for tree in w.trees:
        if not trained(w, tree.nodes[0].call.agent, train_agents):
            s["untrained_sessions"] += 1
            continue
        for path in linear_paths(tree):
            trainable = path.trainable
            if off_policy:
                hit = [own and tree.nodes[i].call.call_id in off_policy for i, own in zip(path.nodes, trainable)]
                if any(hit):
                    if policy_action == "drop":
                        s["policy_dropped"] += 1
                        continue
                    if policy_action == "mask":
                        trainable = [own and not h for own, h in zip(trainable, hit)]
                        s["policy_masked"] += sum(hit)
                    else:
                        s["policy_flagged"] += 1
            if mask_truncated and tree.nodes[path.nodes[-1]].call.finish_reason == "length" and trainable[-1]:
                trainable = [*trainable[:-1], False]
                s["masked_truncated"] += 1
            s["tokens_emitted"] += add(sample(w, tree, path.nodes, trainable, advantage))
            s["samples"] += 1


def sample(w: RolloutWork, tree: SessionTree, nodes: list[int], trainable: list[bool], advantage: str) -> dict[str, Any]:
    leaf = tree.nodes[nodes[-1]].call
    ids = np.concatenate([leaf.prompt, leaf.completion])
    n = len(ids)
    mask = np.zeros(n, dtype=np.int8)
    cls = np.zeros(n, dtype=np.int8)
    adv = np.zeros(n, dtype=np.float32)
    blp = np.zeros(n, dtype=np.float32)
    blp_valid = np.zeros(n, dtype=bool)
    turn = np.full(n, -1, dtype=np.int16)
    process: dict[str, dict[str, float]] = {}
    for i, own in zip(nodes, trainable):
        node = tree.nodes[i]
        c = node.call
        a, b = len(c.prompt), c.s_len
        turn[a:b] = node.decision_index
        u = w.units[c.call_id]
        if u.process:
            process[c.call_id] = u.process
        if not own:
            continue
        mask[a:b] = 1
        cls[a:b] = u.classes
        adv[a:b] = u.advantage
        if c.logprobs is not None and len(c.logprobs) == b - a:
            blp[a:b] = c.logprobs
            blp_valid[a:b] = True
        w.stats["trainable_tokens"] += b - a
    for k, count in enumerate(np.bincount(cls, minlength=len(CLASS_NAMES)).tolist()):
        if k:
            w.stats[f"class_{CLASS_NAMES[k]}"] += count
    breakdown = {"outcome": w.outcome, "process": process, "advantage": advantage,
                 "parent_call": w.edges.get(tree.key)}
    return {
        "sample_id": f"{w.id}/{tree.key}/{leaf.call_id}",
        "rollout_id": w.id, "task_id": w.task_id, "group_id": w.group_id,
        "agent": leaf.agent, "session_id": leaf.session_id,
        "input_ids": ids, "loss_mask": mask, "token_class": cls, "advantage": adv,
        "behaviour_logprob": (blp, blp_valid), "turn_index": turn,
        "call_ids": [tree.nodes[i].call.call_id for i in nodes],
        "call_versions": [tree.nodes[i].call.weight_version for i in nodes],
        "call_turns": [tree.nodes[i].decision_index for i in nodes],
        "prompt_len": len(tree.nodes[nodes[0]].call.prompt),
        "weight_version": leaf.weight_version, "outcome_reward": w.outcome,
        "reward_breakdown": json.dumps(breakdown, sort_keys=True),
        "retokenized": any(tree.nodes[i].call.retokenized for i in nodes),
    }
