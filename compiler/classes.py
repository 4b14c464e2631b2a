"""Token classes of a decision unit (METHODS §3) and the parsed response they come from.

A completion's token ids are decoded to bytes with per-token byte offsets (a table built once
per tokenizer), the response formats are recognised on the bytes (`<think>`, hermes
`<tool_call>` JSON, MATPO `<use_mcp_tool>` XML, `<answer>` / `\\boxed{}`; native `tool_calls`
are found in the raw text the ids still carry), every byte gets a class, and a token takes
the first of action > args > reasoning > format among its bytes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harnessrl.compiler.schema import ACTION, ARGS, FORMAT, NONE, REASONING

# reduction rank: higher wins on a boundary token
_RANK = np.zeros(5, dtype=np.int8)
_RANK[[FORMAT, REASONING, ARGS, ACTION]] = [1, 2, 3, 4]
_FROM_RANK = np.array([FORMAT, FORMAT, REASONING, ARGS, ACTION], dtype=np.int8)

_WS = np.zeros(256, dtype=bool)
_WS[[9, 10, 11, 12, 13, 32]] = True


@dataclass
class ClassConfig:
    """Which tools dispatch a sub-agent, and which argument keys name the sub-agent."""

    dispatch_tools: frozenset[str] = frozenset({"dispatch", "delegate", "call_agent", "run_agent"})
    agent_keys: frozenset[str] = frozenset({"agent", "agent_name", "subagent", "sub_agent", "worker"})


def _bytes_to_unicode() -> dict[int, str]:
    """The byte ↔ printable-character map of byte-level BPE vocabularies (GPT-2 family)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


class TokenText:
    """Token id → bytes table of a tokenizer, for decoding with byte offsets."""

    def __init__(self, tokenizer: Any):
        n = len(tokenizer)
        added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        table: list[bytes] = []
        if type(decoder).__name__ == "ByteLevel":
            to_byte = {c: b for b, c in _bytes_to_unicode().items()}
            for i, tok in enumerate(tokenizer.convert_ids_to_tokens(list(range(n)))):
                if i in added:
                    table.append(added[i].encode())
                elif tok is None:
                    table.append(b"")
                else:
                    table.append(bytes(to_byte.get(ch, 63) for ch in tok))
        else:  # e.g. SentencePiece: per-token decode (a split multi-byte character is approximate)
            table = [tokenizer.decode([i]).encode() for i in range(n)]
        self.table = table
        self.lens = np.array([len(b) for b in table], dtype=np.int64)
        self.special = np.zeros(n, dtype=bool)
        self.special[list(added)] = True
        self.eos_id = tokenizer.eos_token_id

    def decode(self, ids: np.ndarray) -> tuple[bytes, np.ndarray]:
        """Bytes of `ids` and the start offset of each token (plus the end, len(ids)+1 items)."""
        table = self.table
        text = b"".join([table[i] for i in ids.tolist()])
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(self.lens[ids], out=offsets[1:])
        return text, offsets


# ---- parsed response -------------------------------------------------------------------------

@dataclass
class ParsedCall:
    name: str | None
    arguments: dict[str, Any] | None  # None when the arguments do not parse as a JSON object
    raw: str = ""


@dataclass
class ParsedResponse:
    calls: list[ParsedCall] = field(default_factory=list)
    answer: str | None = None  # text of <answer>/\boxed{}, else the content outside think/calls
    has_answer_marker: bool = False


_TOOL_CALL = re.compile(rb"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_MCP = re.compile(rb"<use_mcp_tool>(.*?)(?:</use_mcp_tool>|\Z)", re.S)
_MCP_FIELD = re.compile(rb"<(server_name|tool_name|arguments)>(.*?)(?:</\1>|\Z)", re.S)
_ANSWER = re.compile(rb"(<answer>)(.*?)(</answer>|\Z)", re.S)
_BOXED = re.compile(rb"\\boxed\{")
_THINK_CLOSE = re.compile(rb"</think>")
_THINK = re.compile(rb"(<think>)(.*?)(</think>|\Z)", re.S)


def _json_object(raw: str) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (ValueError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def _native_call(tc: dict[str, Any]) -> ParsedCall:
    f = tc.get("function", tc)
    args = f.get("arguments")
    if isinstance(args, str):
        parsed = _json_object(args)
    else:
        parsed = args if isinstance(args, dict) else None
    return ParsedCall(f.get("name"), parsed, args if isinstance(args, str) else json.dumps(args))


def _boxed_span(text: bytes, start: int) -> tuple[int, int] | None:
    """(content start, closing brace) of a \\boxed{ at `start`, braces balanced."""
    i = start + len(b"\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == 0x7B:
            depth += 1
        elif text[j] == 0x7D:
            depth -= 1
            if depth == 0:
                return i, j
    return None


def parse_response(text: str, native_calls: list[dict[str, Any]] | None = None) -> ParsedResponse:
    """Tool calls (native, else hermes / MATPO text) and the final answer of one completion."""
    raw = text.encode()
    out = ParsedResponse()
    if native_calls:
        out.calls = [_native_call(tc) for tc in native_calls]
    else:
        for m in _TOOL_CALL.finditer(raw):
            body = m.group(1).decode(errors="replace").strip()
            obj = _json_object(body)
            if obj is None:
                out.calls.append(ParsedCall(None, None, body))
                continue
            args = obj.get("arguments", obj.get("parameters"))
            if isinstance(args, str):
                args = _json_object(args)
            name = obj.get("name")
            out.calls.append(ParsedCall(name if isinstance(name, str) else None,
                                        args if isinstance(args, dict) else None, body))
        for m in _MCP.finditer(raw):
            fields = {k.decode(): v.decode(errors="replace").strip() for k, v in _MCP_FIELD.findall(m.group(1))}
            out.calls.append(ParsedCall(fields.get("tool_name"), _json_object(fields.get("arguments", "")),
                                        m.group(1).decode(errors="replace")))
    m = _ANSWER.search(raw)
    if m:
        out.answer, out.has_answer_marker = m.group(2).decode(errors="replace").strip(), True
        return out
    b = _BOXED.search(raw)
    span = _boxed_span(raw, b.start()) if b else None
    if span:
        out.answer, out.has_answer_marker = raw[span[0]:span[1]].decode(errors="replace").strip(), True
        return out
    close = _THINK_CLOSE.search(raw)
    rest = raw[close.end():] if close else raw
    rest = _TOOL_CALL.sub(b"", _MCP.sub(b"", rest))
    rest = re.sub(rb"<\|[^|>]*\|>", b"", rest)  # template specials such as EOS
    out.answer = rest.decode(errors="replace").strip() or None
    return out


# ---- byte labelling --------------------------------------------------------------------------

_LEX = re.compile(rb'"(?:[^"\\]|\\.)*"?|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|[{}\[\]:,]|\s+|[^"{}\[\]:,\s]+')


def _label_json(text: bytes, start: int, end: int, labels: np.ndarray, cfg: ClassConfig,
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
            labels[a:b] = FORMAT
        elif c in b"}]":
            if frames:
                frames.pop()
            labels[a:b] = FORMAT
        elif c == b",":
            if frames and frames[-1][0]:
                frames[-1][1] = True
            labels[a:b] = FORMAT
        elif c == b":":
            labels[a:b] = FORMAT
        else:
            is_key = bool(frames) and frames[-1][0] and frames[-1][1]
            if is_key:
                labels[a:b] = FORMAT
                frames[-1][3] = tok.strip(b'"')
                frames[-1][1] = False
                continue
            role = _value_role(frames, top_roles, tool_name, cfg) if frames else FORMAT
            if top_roles and len(frames) == 1 and frames[0][3] == b"name":
                tool_name = tok.strip(b'"')
            if c == b'"':
                labels[a:b] = FORMAT
                closed = len(tok) >= 2 and tok.endswith(b'"')
                labels[a + 1:b - 1 if closed else b] = role
            else:
                labels[a:b] = role


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


def label_bytes(text: bytes, special: np.ndarray | None = None,
                native_calls: list[dict[str, Any]] | None = None,
                cfg: ClassConfig | None = None) -> np.ndarray:
    """A class per byte of a completion. `special`: bytes of special tokens (EOS, tags)."""
    cfg = cfg or ClassConfig()
    labels = np.zeros(len(text), dtype=np.int8)
    close = _THINK_CLOSE.search(text)
    if close and text.find(b"<think>", 0, close.start()) < 0:  # the template opened <think>
        labels[: close.start()] = REASONING
        labels[close.start():close.end()] = FORMAT
    for m in _THINK.finditer(text):
        labels[m.start(1):m.end(1)] = FORMAT
        labels[m.start(2):m.end(2)] = REASONING
        labels[m.start(3):m.end(3)] = FORMAT
    for m in _TOOL_CALL.finditer(text):
        labels[m.start():m.end()] = FORMAT
        _label_json(text, m.start(1), m.end(1), labels, cfg, top_roles=True)
    for m in _MCP.finditer(text):
        labels[m.start():m.end()] = FORMAT
        for f in _MCP_FIELD.finditer(text, m.start(1), m.end(1)):
            if f.group(1) == b"arguments":
                _label_json(text, f.start(2), f.end(2), labels, cfg, top_roles=False)
            else:  # server (sub-agent) and tool names are the decision
                labels[f.start(2):f.end(2)] = ACTION
    for m in _ANSWER.finditer(text):
        labels[m.start(1):m.end(1)] = ACTION
        labels[m.start(2):m.end(2)] = ARGS
        labels[m.start(3):m.end(3)] = FORMAT
    for m in _BOXED.finditer(text):
        span = _boxed_span(text, m.start())
        end = span[1] + 1 if span else len(text)
        labels[m.start():m.end() - 1] = ACTION
        labels[m.end() - 1] = FORMAT
        labels[m.end():end - 1 if span else end] = ARGS
        if span:
            labels[span[1]] = FORMAT
    if native_calls and not (labels == ACTION).any():
        _label_native(text, labels, native_calls)
    free = labels == NONE
    if special is not None:
        labels[free & special] = FORMAT
        free = labels == NONE
    ws = _WS[np.frombuffer(text, dtype=np.uint8)] if text else np.zeros(0, dtype=bool)
    labels[free & ws] = FORMAT
    labels[free & ~ws] = REASONING
    return labels


def _label_native(text: bytes, labels: np.ndarray, native_calls: list[dict[str, Any]]) -> None:
    """Tool calls in a format we do not parse: find the name and the argument values in the
    raw text, in order."""
    pos = 0
    for tc in native_calls:
        call = _native_call(tc)
        if call.name:
            i = text.find(call.name.encode(), pos)
            if i >= 0:
                labels[i:i + len(call.name.encode())] = ACTION
                pos = i + len(call.name.encode())
        for v in (call.arguments or {}).values():
            needle = (v if isinstance(v, str) else json.dumps(v)).encode()
            i = text.find(needle, pos) if needle else -1
            if i >= 0:
                labels[i:i + len(needle)] = ARGS
                pos = i + len(needle)


def token_classes(ids: np.ndarray, tt: TokenText, native_calls: list[dict[str, Any]] | None = None,
                  cfg: ClassConfig | None = None) -> np.ndarray:
    """A class per completion token (action > args > reasoning > format on boundary tokens)."""
    if len(ids) == 0:
        return np.zeros(0, dtype=np.int8)
    text, offsets = tt.decode(ids)
    special = np.repeat(tt.special[ids], tt.lens[ids])
    labels = label_bytes(text, special, native_calls, cfg)
    starts, ends = offsets[:-1], offsets[1:]
    nonempty = ends > starts
    out = np.full(len(ids), FORMAT, dtype=np.int8)
    if nonempty.any():
        ranks = _RANK[labels]
        out[nonempty] = _FROM_RANK[np.maximum.reduceat(ranks, starts[nonempty])]
        # reduceat spans run to the next start; empty tokens share a start with the next token,
        # so the spans of the non-empty tokens are exact
    return out
