"""One rollout as the page shows it: the calls on a timeline by agent and session, each session's
prefix tree (compiler/trees.py, the same trees the compiler builds), every completion's tokens with
their class and log-prob, rewards, and with a compile output the samples' loss mask and advantages.

The result is plain data (dicts and lists), rendered by the template and served as JSON as is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, select

from harnessrl.compiler.trees import CallTokens, build_forest, session_key
from harnessrl.messages import content_text
from harnessrl.records import Call, Reward, Rollout, unpack_ids, unpack_logprobs
from harnessrl.viewer.flow import same_tools, sessions
from harnessrl.viewer.labels import Labeller, class_name, labeller
from harnessrl.viewer.samples import Samples

MAX_SAMPLE_TOKENS = 4000  # tokens of one sample shown (the rest is summarised)
PREVIEW = 160  # characters of a call's one-line preview (its action, reply or error)
MAX_BLOCKS_JSON = 4000  # characters of a text-less content's JSON shown
FOLDED_ROLES = ("tool", "system", "developer")  # tool results and system prompts: shown on demand


def lp_bucket(lp: float | None) -> int:
    """Shading step of a token's log-prob: 0 (p ≳ 0.9) … 4 (p < 0.05)."""
    if lp is None or math.isnan(lp):
        return 0
    return next((i for i, bound in enumerate((-0.1, -0.5, -1.5, -3.0)) if lp >= bound), 4)


def adv_bucket(a: float) -> str:
    """Colour step of an advantage: p1..p3 above zero, n1..n3 below, z near zero."""
    mag = abs(a)
    if mag < 0.05:
        return "z"
    step = 1 if mag < 0.5 else 2 if mag < 1.0 else 3
    return f"{'p' if a > 0 else 'n'}{step}"


def find_tokenizer(engine: Engine, given: str | None) -> str | None:
    """The tokenizer for token text and classes: the given one, else a recorded model name that
    is a local directory (the compiler's rule)."""
    if given:
        return given
    with engine.connect() as conn:
        models = conn.execute(select(Call.model).where(Call.model.is_not(None)).distinct().limit(20)).scalars()
        return next((m for m in models if Path(m).is_dir()), None)


def _as_shown(value: Any, what: str) -> list[dict[str, Any]]:
    """A list of messages as is; anything else (a refused call's body is recorded as sent, so it
    may be malformed) as one message holding its JSON."""
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return value
    return [{"role": what, "content": json.dumps(value, ensure_ascii=False)}]


def _messages(request: Any) -> list[dict[str, Any]]:
    if not isinstance(request, dict):
        return _as_shown(request, "request")
    if "messages" in request:
        return _as_shown(request["messages"], "messages")
    if "prompt" in request:
        prompt = request["prompt"]
        return [{"role": "prompt", "content": prompt if isinstance(prompt, str) else str(prompt)}]
    # a call refused before translation keeps only its surface's own body (Anthropic messages
    # or Responses input), shown as it came
    own = request.get("harnessrl_surface")
    body = own.get("body") if isinstance(own, dict) else None
    if not isinstance(body, dict):
        return []
    if "messages" in body:
        return _as_shown(body["messages"], "messages")
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        return _as_shown(items, "input")
    return [{"role": str(i.get("role") or i.get("type")), "content": i.get("content", i.get("output", i.get("arguments")))}
            if isinstance(i, dict) else _as_shown(i, "input")[0] for i in items]


def _clip(text: str, n: int = PREVIEW) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"


def _tool_call(tc: dict[str, Any]) -> dict[str, Any]:
    f = tc["function"] if isinstance(tc.get("function"), dict) else {}
    return {"name": f.get("name"), "arguments": f.get("arguments")}


def _message_view(m: dict[str, Any]) -> dict[str, Any]:
    listed = m.get("tool_calls")
    calls = [_tool_call(tc) for tc in (listed if isinstance(listed, list) else []) if isinstance(tc, dict)]
    raw = m.get("content")
    # content blocks without text (tool_use, tool_result of a surface's own body) as their JSON
    content = content_text(raw) or ("" if raw in (None, "", []) else json.dumps(raw, ensure_ascii=False))
    if len(content) > MAX_BLOCKS_JSON and not content_text(raw):  # e.g. an image's base64
        content = f"{content[:MAX_BLOCKS_JSON]}… ({len(content)} characters)"
    role = str(m.get("role", "?"))
    return {"role": role, "content": content, "tool_calls": calls, "name": m.get("name") or m.get("tool_call_id"),
            "fold": role in FOLDED_ROLES, "first": _clip(content, 100), "size": len(content)}


def _tool_schema(t: Any) -> dict[str, Any]:
    """A request's tool, in any surface's shape: chat (`function: {…}`), Responses (flat) or
    Anthropic (`input_schema`)."""
    if not isinstance(t, dict):
        return {"name": "?", "description": "", "parameters": json.dumps(t)}
    f = t["function"] if isinstance(t.get("function"), dict) else t
    params = f.get("parameters", f.get("input_schema"))
    return {"name": str(f.get("name") or t.get("type") or "?"), "description": str(f.get("description") or ""),
            "parameters": "" if params is None else json.dumps(params, indent=2, ensure_ascii=False)}


def _preview(c: Any, tool_calls: list[dict[str, Any]]) -> str:
    """The call at a glance: its error, else the tools it called, else the start of its reply."""
    if c.status != "ok" and c.error:
        return _clip(c.error)
    if tool_calls:
        return _clip("→ " + ", ".join(f"{tc['name']}({tc['arguments'] or ''})" for tc in tool_calls))
    return _clip(c.response_text or "")


def _tokens(lab: Labeller | None, ids: np.ndarray | None, classes: np.ndarray | None,
            logprobs: np.ndarray | None) -> list[dict[str, Any]]:
    if lab is None or ids is None:
        return []
    out = []
    for k, (text, special) in enumerate(lab.pieces(ids)):
        lp = float(logprobs[k]) if logprobs is not None and k < len(logprobs) else None
        out.append({"text": text, "special": special, "cls": class_name(classes[k]) if classes is not None else "none",
                    "lp": lp, "lpb": lp_bucket(lp)})
    return out


def _reward_meta(meta: Any) -> dict[str, Any] | None:
    """A reward's metadata for the page: its `output` (a test run's, kept whole as text) apart
    from the other fields, shown as JSON."""
    if not isinstance(meta, dict) or not meta:
        return None
    rest = {k: v for k, v in meta.items() if k != "output"}
    output = meta.get("output")
    return {"output": output if isinstance(output, str) else None,
            "fields": json.dumps(rest, ensure_ascii=False, sort_keys=True) if rest else ""}


def rollout_view(engine: Engine, rollout_id: str, tokenizer: str | None = None,
                 samples: Samples | None = None) -> dict[str, Any] | None:
    """Everything the rollout page shows; None when there is no such rollout. `tokenizer`: the
    directory for token text and classes (`find_tokenizer`); without one, completions are text."""
    with engine.connect() as conn:
        ro = conn.execute(select(Rollout).where(Rollout.id == rollout_id)).first()
        if ro is None:
            return None
        calls = conn.execute(select(Call).where(Call.rollout_id == rollout_id).order_by(Call.seq)).all()
        rewards = conn.execute(select(Reward.call_id, Reward.kind, Reward.name, Reward.value, Reward.meta)
                               .where(Reward.rollout_id == rollout_id).order_by(Reward.id)).all()
    lab = labeller(tokenizer) if tokenizer else None
    tokens: dict[str, CallTokens] = {}
    for c in calls:
        if c.status == "ok" and c.prompt_ids is not None and c.completion_ids is not None:
            tokens[c.id] = CallTokens(call_id=c.id, seq=c.seq, key=session_key(c.session_id, c.agent),
                                      prompt=unpack_ids(c.prompt_ids), completion=unpack_ids(c.completion_ids),
                                      logprobs=unpack_logprobs(c.completion_logprobs), agent=c.agent,
                                      session_id=c.session_id, parent_call_id=c.parent_call_id)
    by_id = {c.id: c for c in calls}
    order = list(tokens)
    mismatch = None
    if lab is not None and any(len(t.completion) and int(t.completion.max()) >= lab.vocab for t in tokens.values()):
        mismatch = f"token ids beyond the vocabulary of {tokenizer} (pass the recorded model's --tokenizer)"
        lab = None
    classes: dict[str, np.ndarray] = {}
    if lab is not None and order:
        natives = [by_id[i].tool_calls for i in order]
        classes = dict(zip(order, lab.classes([tokens[i].completion for i in order], natives)))
    process: dict[str, dict[str, float]] = {}
    outcome: float | None = None
    for r in rewards:
        if r.kind == "outcome":
            outcome = r.value  # the latest report wins
        elif r.call_id:
            process.setdefault(r.call_id, {})[r.name] = r.value
    forest = build_forest(list(tokens.values()))
    messages = {c.id: _messages(c.request if c.request is not None else {}) for c in calls}
    flow = sessions(calls, forest, messages)
    # a call shows the messages it added: those after its parent's messages and reply (the
    # parent's completion shows that), so a long session is not quadratic in its history
    added_from = {r["call"]: min(len(messages[r["parent"]]) + (by_id[r["parent"]].status == "ok"),
                                 len(messages[r["call"]]))
                  for s in flow["sessions"] for r in s["rows"]
                  if r["parent"] is not None and by_id[r["call"]].endpoint == "chat"}
    same = same_tools(calls)
    views = {c.id: _call_view(c, tokens.get(c.id), classes.get(c.id), lab, process.get(c.id, {}),
                              added_from.get(c.id, 0), messages[c.id], same.get(c.id)) for c in calls}
    trees = [_tree_view(t, by_id) for t in forest]
    if samples is not None:
        _attach_samples(trees, samples.of_rollout(rollout_id), lab)
    for s in flow["sessions"]:  # a session holds its compiler tree's samples (the same key)
        s["samples"] = next((t["samples"] for t in trees if t["key"] == s["key"]), [])
    return {
        "rollout": {"id": ro.id, "task": ro.task_id, "group": ro.group_id, "run": ro.run, "status": ro.status,
                    "errors": ro.errors, "started": ro.created_at,
                    "duration": (ro.finished_at - ro.created_at) if ro.finished_at else None,
                    "meta": ro.meta},
        "outcome": outcome,
        "rewards": [{"call_id": r.call_id, "kind": r.kind, "name": r.name, "value": r.value,
                     "meta": _reward_meta(r.meta)} for r in rewards],
        "tokenizer": tokenizer if lab is not None else None,
        "tokenizer_error": mismatch,
        "calls": [views[c.id] for c in calls],
        "timeline": _timeline(calls),
        "trees": trees,
        "untreed": [views[c.id]["id"] for c in calls if c.id not in tokens],
        **flow,
        "has_samples": samples is not None,
    }


def _call_view(c: Any, ct: CallTokens | None, classes: np.ndarray | None, lab: Labeller | None,
               process: dict[str, float], added_from: int, messages: list[Any],
               tools_same_as: str | None) -> dict[str, Any]:
    completion = ct.completion if ct is not None else None
    tool_calls = [_tool_call(tc) for tc in c.tool_calls or [] if isinstance(tc, dict)]
    tools = (c.request.get("tools") if isinstance(c.request, dict) else None) or []
    return {
        "id": c.id, "seq": c.seq, "agent": c.agent, "session_id": c.session_id,
        "key": session_key(c.session_id, c.agent), "parent_call_id": c.parent_call_id, "endpoint": c.endpoint,
        "surface": c.surface, "client": c.client,
        "model": c.model, "stream": c.stream, "status": c.status, "error": c.error, "finish_reason": c.finish_reason,
        "latency_ms": c.latency_ms, "weight_version": c.weight_version, "prompt_path": c.prompt_path,
        "prefix_call_id": c.prefix_call_id, "drift": c.drift, "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens, "response_text": c.response_text,
        "tool_calls": tool_calls, "preview": _preview(c, tool_calls),
        "added_from": added_from,  # messages before this index were already in the tree parent
        "messages": [_message_view(m) for m in messages[added_from:] if isinstance(m, dict)],
        # the schemas when they differ from the session's previous call's, else that call
        "n_tools": len(tools) if isinstance(tools, list) else 0, "tools_same_as": tools_same_as,
        "tools": [] if tools_same_as or not isinstance(tools, list) else [_tool_schema(t) for t in tools],
        "tokens": _tokens(lab, completion, classes, ct.logprobs if ct is not None else None),
        "process": process,
    }


def _tree_view(tree: Any, by_id: dict[str, Any]) -> dict[str, Any]:
    nodes = []
    for node in tree.nodes:
        call = node.call
        nodes.append({"call": call.call_id, "seq": call.seq, "parent": node.parent, "cause": node.cause,
                      "turn": node.decision_index, "children": node.children,
                      "branch": node.parent >= 0 and len(tree.nodes[node.parent].children) > 1})
    first = by_id[tree.nodes[0].call.call_id]
    return {"key": tree.key, "agent": first.agent, "session_id": first.session_id, "nodes": nodes,
            "roots": tree.roots, "dispatched_by": first.parent_call_id, "samples": []}


def _attach_samples(trees: list[dict[str, Any]], rows: list[dict[str, Any]], lab: Labeller | None) -> None:
    """Each sample under the session tree its calls belong to, with per-token class, loss mask
    and advantage from the compile output (not recomputed)."""
    home = {n["call"]: t for t in trees for n in t["nodes"]}
    for row in sorted(rows, key=lambda r: r["sample_id"]):
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        start = int(row["prompt_len"])
        end = min(len(ids), start + MAX_SAMPLE_TOKENS)
        mask = np.asarray(row["loss_mask"], dtype=bool)
        adv = np.asarray(row["advantage"], dtype=np.float64)
        cls = np.asarray(row["token_class"])
        pieces = lab.pieces(ids[start:end]) if lab else [(f"[{i}]", False) for i in ids[start:end].tolist()]
        toks = [{"text": text, "special": special, "mask": bool(mask[k]), "cls": class_name(cls[k]),
                 "adv": float(adv[k]), "advb": adv_bucket(float(adv[k])) if mask[k] else "off"}
                for k, (text, special) in zip(range(start, end), pieces)]
        trained = adv[mask]
        view = {"id": row["sample_id"], "call_ids": list(row["call_ids"] or []), "tokens": toks,
                "trained": int(mask.sum()), "length": len(ids), "truncated": len(ids) - end,
                "adv_min": float(trained.min()) if len(trained) else None,
                "adv_max": float(trained.max()) if len(trained) else None,
                "outcome_reward": row["outcome_reward"]}
        tree = next((home[c] for c in view["call_ids"] if c in home), None)
        if tree is not None:
            tree["samples"].append(view)


def _timeline(calls: list[Any]) -> dict[str, Any]:
    """Lanes (agent, session key) in order of first call; a column per call in seq order."""
    lanes: dict[str, dict[str, Any]] = {}
    for c in calls:
        key = session_key(c.session_id, c.agent)
        lanes.setdefault(key, {"key": key, "agent": c.agent, "cells": {}})["cells"][c.seq] = c.id
    seqs = [c.seq for c in calls]
    seq_of = {c.id: c.seq for c in calls}
    edges = [{"from": seq_of[c.parent_call_id], "to": c.seq} for c in calls if c.parent_call_id in seq_of]
    return {"seqs": seqs, "lanes": [{"key": ln["key"], "agent": ln["agent"],
                                     "cells": [ln["cells"].get(s) for s in seqs]} for ln in lanes.values()],
            "edges": edges}
