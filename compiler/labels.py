"""Token classes of a decision unit (docs/methods.md §3), labelled on the completion's bytes.

A completion's ids are decoded to bytes with per-token offsets (`tokentext`), the response
formats are recognised on the bytes (`<think>`, hermes `<tool_call>` JSON, MATPO
`<use_mcp_tool>` XML, `<answer>` / `\\boxed{}`; native `tool_calls` are found in the raw text the
ids still carry), every byte gets a class, and a token takes the first of
action > args > reasoning > format among its bytes. A completion with no call and no answer
marker is a final answer: its free text is `args` (docs/methods.md §3), or `reasoning` with
`ClassConfig(unmarked_answer="reasoning")`.

Cost: a batch of completions is joined with a NUL separator and labelled with one regex pass per
format and one numpy paint, so a call costs a few regex matches, not Python per token.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from harnessrl.compiler.response import ANSWER, BOXED, MCP, MCP_FIELD, THINK, THINK_CLOSE, TOOL_CALL, boxed_span, native_call
from harnessrl.samples import ACTION, ARGS, FORMAT, NONE, REASONING
from harnessrl.compiler.tokentext import TokenText
from harnessrl.errors import UserError

# reduction rank: higher wins on a boundary token
_RANK = np.zeros(5, dtype=np.int8)
_RANK[[FORMAT, REASONING, ARGS, ACTION]] = [1, 2, 3, 4]
_FROM_RANK = np.array([FORMAT, FORMAT, REASONING, ARGS, ACTION], dtype=np.int8)


@dataclass
class ClassConfig:
    """Which tools dispatch a sub-agent, which argument keys name the sub-agent, and the class of
    a final answer written without a marker (`args` as docs/methods.md §3 says, or `reasoning`)."""

    dispatch_tools: frozenset[str] = frozenset({"dispatch", "delegate", "call_agent", "run_agent"})
    agent_keys: frozenset[str] = frozenset({"agent", "agent_name", "subagent", "sub_agent", "worker"})
    unmarked_answer: str = "args"

    def __post_init__(self) -> None:
        if self.unmarked_answer not in ("args", "reasoning"):
            raise UserError(f"unmarked answer class {self.unmarked_answer!r}: use args or reasoning")


# ---- byte labelling --------------------------------------------------------------------------

_LEX = re.compile(rb'"(?:[^"\\]|\\.)*"?|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|[{}\[\]:,]|\s+|[^"{}\[\]:,\s]+')


def _label_json(text: bytes, start: int, end: int, spans: list, cfg: ClassConfig,
                top_roles: bool) -> None:
    """Label a (possibly malformed) JSON text lexically. `top_roles`: the top object is a call
    `{"name": …, "arguments": …}`; otherwise it is the arguments object itself."""
    # frames: [is_object, expecting_key, role of values in this frame, current key]
    frames: list[list[Any]] = []
    tool_name = b""
    for m in _LEX.finditer(text, start, end):
        tok = m.group(0)
        a, b = m.start(), m.end()
        c = tok[:1]
        if c.isspace():
            continue
        if c in b"{[":
            role = ARGS if not frames else _value_role(frames, top_roles, tool_name, cfg)
            if frames and frames[-1][0]:
                frames[-1][1] = False
            frames.append([c == b"{", c == b"{", role, b""])
            spans.append((a, b, FORMAT))
        elif c in b"}]":
            if frames:
                frames.pop()
            spans.append((a, b, FORMAT))
        elif c == b",":
            if frames and frames[-1][0]:
                frames[-1][1] = True
            spans.append((a, b, FORMAT))
        elif c == b":":
            spans.append((a, b, FORMAT))
        else:
            is_key = bool(frames) and frames[-1][0] and frames[-1][1]
            if is_key:
                spans.append((a, b, FORMAT))
                frames[-1][3] = tok.strip(b'"')
                frames[-1][1] = False
                continue
            role = _value_role(frames, top_roles, tool_name, cfg) if frames else FORMAT
            if top_roles and len(frames) == 1 and frames[0][3] == b"name":
                tool_name = tok.strip(b'"')
            if c == b'"':
                spans.append((a, b, FORMAT))
                closed = len(tok) >= 2 and tok.endswith(b'"')
                spans.append((a + 1, b - 1 if closed else b, role))
            else:
                spans.append((a, b, role))


def _value_role(frames: list[list[Any]], top_roles: bool, tool_name: bytes, cfg: ClassConfig) -> int:
    key = frames[-1][3]
    if top_roles and len(frames) == 1:
        if key == b"name":
            return ACTION
        return ARGS if key in (b"arguments", b"parameters") else FORMAT
    is_dispatch = tool_name.decode(errors="replace") in cfg.dispatch_tools
    depth_of_args = 2 if top_roles else 1
    if is_dispatch and len(frames) == depth_of_args and key.decode(errors="replace") in cfg.agent_keys:
        return ACTION
    return frames[-1][2]


_HERMES_CALL = re.compile(rb'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(\{.*\})\s*\}\s*', re.S)
_ARG_VALUES = re.compile(rb'"((?:[^"\\]|\\.)*)"(\s*:)?|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null')


def _label_hermes(text: bytes, start: int, end: int, spans: list, cfg: ClassConfig) -> None:
    """`{"name": …, "arguments": {…}}`: one match and a scan of the values (the common, fast
    case); anything else (other key order, malformed JSON, a dispatch) goes through the lexer."""
    m = _HERMES_CALL.fullmatch(text, start, end)
    if m is None or m.group(1).decode(errors="replace") in cfg.dispatch_tools:
        _label_json(text, start, end, spans, cfg, top_roles=True)
        return
    spans.append((m.start(1), m.end(1), ACTION))
    for v in _ARG_VALUES.finditer(text, m.start(2), m.end(2)):
        if v.group(2) is not None:
            continue  # a key
        if v.group(1) is not None:
            spans.append((v.start(1), v.end(1), ARGS))
        else:
            spans.append((v.start(), v.end(), ARGS))


def label_bytes(text: bytes, special_spans: list[tuple[int, int]] = (),
                native_calls: list[dict[str, Any]] | None = None,
                cfg: ClassConfig | None = None) -> np.ndarray:
    """A class per byte of one completion. `special_spans`: byte spans of special tokens (EOS,
    tags): format unless a recognised span covers them."""
    return _label(text, [0], list(special_spans), [native_calls], cfg or ClassConfig())


def _paint(labels: np.ndarray, spans: list[tuple[int, int, int]]) -> None:
    """Paint (start, end, class) spans; where spans overlap the later one wins."""
    if not spans:
        return
    arr = np.asarray(spans, dtype=np.int64)
    starts, lens, values = arr[:, 0], np.maximum(arr[:, 1] - arr[:, 0], 0), arr[:, 2]
    offsets = np.cumsum(lens) - lens
    idx = np.repeat(starts - offsets, lens) + np.arange(int(lens.sum()))
    last = np.full(len(labels), -1, dtype=np.int64)
    np.maximum.at(last, idx, np.repeat(np.arange(len(spans)), lens))
    hit = last >= 0
    labels[hit] = values[last[hit]]


def _label(text: bytes, call_starts: list[int], special_spans: list[tuple[int, int]],
           natives: list[list[dict[str, Any]] | None], cfg: ClassConfig) -> np.ndarray:
    """Labels for completions joined by NUL bytes starting at `call_starts`: one regex pass per
    format over the whole batch; spans are collected in this order (later wins) and painted
    at once."""
    labels = np.zeros(len(text), dtype=np.int8)
    labels[np.asarray(call_starts[1:], dtype=np.int64) - 1] = FORMAT  # the separators
    spans: list[tuple[int, int, int]] = [(a, b, FORMAT) for a, b in special_spans]
    add = spans.append
    if b"think>" in text:
        for close in THINK_CLOSE.finditer(text):
            start = call_starts[bisect.bisect_right(call_starts, close.start()) - 1]
            if text.find(b"<think>", start, close.start()) < 0:  # the template opened <think>
                add((start, close.start(), REASONING))
                add((close.start(), close.end(), FORMAT))
        for m in THINK.finditer(text):
            add((m.start(1), m.end(1), FORMAT))
            add((m.start(2), m.end(2), REASONING))
            add((m.start(3), m.end(3), FORMAT))
    if b"<tool_call>" in text:
        for m in TOOL_CALL.finditer(text):
            add((m.start(), m.end(), FORMAT))
            _label_hermes(text, m.start(1), m.end(1), spans, cfg)
    if b"<use_mcp_tool>" in text:
        for m in MCP.finditer(text):
            add((m.start(), m.end(), FORMAT))
            for f in MCP_FIELD.finditer(text, m.start(1), m.end(1)):
                if f.group(1) == b"arguments":
                    _label_json(text, f.start(2), f.end(2), spans, cfg, top_roles=False)
                else:  # server (sub-agent) and tool names are the decision
                    add((f.start(2), f.end(2), ACTION))
    if b"<answer>" in text:
        for m in ANSWER.finditer(text):
            add((m.start(1), m.end(1), ACTION))
            add((m.start(2), m.end(2), ARGS))
            add((m.start(3), m.end(3), FORMAT))
    if b"\\boxed{" in text:
        for m in BOXED.finditer(text):
            span = boxed_span(text, m.start())
            add((m.start(), m.end() - 1, ACTION))
            add((m.end() - 1, m.end(), FORMAT))
            if span:
                add((span[0], span[1], ARGS))
                add((span[1], span[1] + 1, FORMAT))
            else:
                stop = text.find(b"\x00", m.end())
                add((m.end(), stop if stop >= 0 else len(text), ARGS))
    _paint(labels, spans)
    native_spans: list[tuple[int, int, int]] = []
    for k, native in enumerate(natives):
        if native:
            a = call_starts[k]
            b = call_starts[k + 1] - 1 if k + 1 < len(call_starts) else len(text)
            if not (labels[a:b] == ACTION).any():
                _label_native(text, a, b, native_spans, native)
    _paint(labels, native_spans)
    answer = _answer_regions(text, labels, call_starts, natives) if cfg.unmarked_answer == "args" else None
    _label_free_text(text, labels, answer)
    return labels


def _answer_regions(text: bytes, labels: np.ndarray, call_starts: list[int],
                    natives: list[list[dict[str, Any]] | None]) -> np.ndarray:
    """Bytes that are an unmarked final answer: after the last `</think>` of a completion that
    makes no call and has no answer marker (a marker or a call would have labelled an action)."""
    out = np.zeros(len(text), dtype=bool)
    ends = [s - 1 for s in call_starts[1:]] + [len(text)]
    for a, b, native in zip(call_starts, ends, natives):
        if native or text.find(b"<tool_call>", a, b) >= 0 or text.find(b"<use_mcp_tool>", a, b) >= 0:
            continue
        if (labels[a:b] == ACTION).any():
            continue
        close = text.rfind(b"</think>", a, b)
        out[a if close < 0 else close + len(b"</think>"):b] = True
    return out


def _label_free_text(text: bytes, labels: np.ndarray, answer: np.ndarray | None) -> None:
    """Unlabelled runs are free text: reasoning, or args inside an unmarked final answer;
    whitespace at either end is format."""
    free = np.flatnonzero(labels == NONE)
    if not len(free):
        return
    breaks = np.flatnonzero(np.diff(free) > 1)
    starts = [int(free[0])] + (free[breaks + 1]).tolist()
    ends = (free[breaks] + 1).tolist() + [int(free[-1]) + 1]
    for a, b in zip(starts, ends):
        seg = text[a:b]
        lead = len(seg) - len(seg.lstrip())
        body = len(seg.rstrip())
        labels[a:b] = FORMAT
        if body > lead:
            span = slice(a + lead, a + body)
            labels[span] = REASONING if answer is None else np.where(answer[span], ARGS, REASONING)


def _label_native(text: bytes, start: int, end: int, spans: list, native_calls: list[dict[str, Any]]) -> None:
    """Tool calls in a format we do not parse: find the name and the argument values in the
    raw text, in order."""
    pos = start
    for tc in native_calls:
        call = native_call(tc)
        if call.name:
            i = text.find(call.name.encode(), pos, end)
            if i >= 0:
                spans.append((i, i + len(call.name.encode()), ACTION))
                pos = i + len(call.name.encode())
        for v in (call.arguments or {}).values():
            needle = (v if isinstance(v, str) else json.dumps(v)).encode()
            i = text.find(needle, pos, end) if needle else -1
            if i >= 0:
                spans.append((i, i + len(needle), ARGS))
                pos = i + len(needle)


def token_classes(ids: np.ndarray, tt: TokenText, native_calls: list[dict[str, Any]] | None = None,
                  cfg: ClassConfig | None = None) -> np.ndarray:
    """A class per completion token (action > args > reasoning > format on boundary tokens)."""
    return batch_token_classes([ids], tt, [native_calls], cfg)[0]


def batch_token_classes(completions: list[np.ndarray], tt: TokenText,
                        natives: list[list[dict[str, Any]] | None] | None = None,
                        cfg: ClassConfig | None = None) -> list[np.ndarray]:
    """Token classes of many completions at once: joined with a NUL separator token, decoded
    with one gather and labelled in one pass, so the per-call cost is a few regex matches."""
    cfg = cfg or ClassConfig()
    natives = natives or [None] * len(completions)
    if not completions:
        return []
    counts = np.array([len(c) for c in completions], dtype=np.int64)
    pieces = []
    for c in completions:
        pieces.append(np.asarray(c, dtype=np.int64))
        pieces.append(np.array([tt.sep], dtype=np.int64))
    ids = np.concatenate(pieces[:-1])
    text, offsets = tt.decode(ids)
    positions = np.cumsum(counts + 1) - 1  # the separators' token positions
    if text.count(b"\x00") != len(completions) - 1:  # a NUL inside a completion: label one by one
        return [batch_token_classes([c], tt, [n], cfg)[0] if b"\x00" not in tt.decode(c)[0]
                else _one_by_one(c, tt, n, cfg) for c, n in zip(completions, natives)]
    call_starts = [0] + (offsets[positions[:-1]] + 1).tolist()
    specials = np.flatnonzero(tt.special_sep[ids])
    special_spans = list(zip(offsets[specials].tolist(), offsets[specials + 1].tolist()))
    labels = _label(text, call_starts, special_spans, natives, cfg)
    out = _reduce(labels, offsets)
    keep = np.ones(len(ids), dtype=bool)
    keep[positions[:-1]] = False
    return np.split(out[keep], np.cumsum(counts)[:-1].tolist())


def _reduce(labels: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per token, the first of action > args > reasoning > format among its bytes."""
    out = np.full(len(offsets) - 1, FORMAT, dtype=np.int8)
    starts = offsets[:-1]
    nonempty = offsets[1:] > starts
    if nonempty.any():
        # a token's span runs to the next non-empty token's start: exactly its own bytes
        out[nonempty] = _FROM_RANK[np.maximum.reduceat(_RANK[labels], starts[nonempty])]
    return out


def _one_by_one(ids: np.ndarray, tt: TokenText, native: list[dict[str, Any]] | None, cfg: ClassConfig) -> np.ndarray:
    """A completion whose text holds NUL bytes: regexes may stop at them, but no other
    completion is affected."""
    text, offsets = tt.decode(ids)
    specials = np.flatnonzero(tt.special[np.asarray(ids, dtype=np.int64)]).tolist()
    labels = _label(text, [0], [(offsets[i], offsets[i + 1]) for i in specials], [native], cfg)
    return _reduce(labels, offsets)
