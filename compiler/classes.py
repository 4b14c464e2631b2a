"""Token classes of a decision unit (METHODS §3) and the parsed response they come from.

A completion's token ids are decoded to bytes with per-token byte offsets (a table built once
per tokenizer), the response formats are recognised on the bytes (`<think>`, hermes
`<tool_call>` JSON, MATPO `<use_mcp_tool>` XML, `<answer>` / `\\boxed{}`; native `tool_calls`
are found in the raw text the ids still carry), every byte gets a class, and a token takes
the first of action > args > reasoning > format among its bytes.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harnessrl.compiler.schema import ACTION, ARGS, FORMAT, NONE, REASONING

# reduction rank: higher wins on a boundary token
_RANK = np.zeros(5, dtype=np.int8)
_RANK[[FORMAT, REASONING, ARGS, ACTION]] = [1, 2, 3, 4]
_FROM_RANK = np.array([FORMAT, FORMAT, REASONING, ARGS, ACTION], dtype=np.int8)



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
        """`tokenizer`: a transformers tokenizer or a `tokenizers.Tokenizer`."""
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        n = backend.get_vocab_size(with_added_tokens=True)
        added = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
        table: list[bytes] = []
        if type(backend.decoder).__name__ == "ByteLevel":
            to_byte = {c: b for b, c in _bytes_to_unicode().items()}
            for i in range(n):
                tok = backend.id_to_token(i)
                if i in added:
                    table.append(added[i].encode())
                elif tok is None:
                    table.append(b"")
                else:
                    table.append(bytes(to_byte.get(ch, 63) for ch in tok))
        else:  # e.g. SentencePiece: per-token decode (a split multi-byte character is approximate)
            table = [backend.decode([i], skip_special_tokens=False).encode() for i in range(n)]
        self.table = table
        self.lens = np.array([len(b) for b in table], dtype=np.int64)
        self.special = np.zeros(n, dtype=bool)
        self.special[list(added)] = True
        # the vocabulary as one byte buffer (+ a NUL "separator token" with id n): a batch of
        # completions decodes with one gather
        self.sep = n
        self.buffer = np.frombuffer(b"".join(table) + b"\x00", dtype=np.uint8)
        self.starts = np.concatenate([[0], np.cumsum(self.lens)]).astype(np.int64)
        self.lens_sep = np.concatenate([self.lens, [1]])
        self.special_sep = np.concatenate([self.special, [False]])

    @classmethod
    def from_dir(cls, path: str | Path) -> TokenText:
        """From a model/tokenizer directory; reads `tokenizer.json` directly when there is one
        (no transformers import: the compiler starts in a fraction of a second)."""
        path = Path(path)
        if (path / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            return cls(Tokenizer.from_file(str(path / "tokenizer.json")))
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(path))

    def decode(self, ids: np.ndarray) -> tuple[bytes, np.ndarray]:
        """Bytes of `ids` (the separator id gives a NUL byte) and the start offset of each token
        (plus the end: len(ids)+1 items)."""
        ids = np.asarray(ids, dtype=np.int64)
        lens = self.lens_sep[ids]
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        gather = np.repeat(self.starts[ids] - offsets[:-1], lens) + np.arange(offsets[-1])
        return self.buffer[gather].tobytes(), offsets


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


# `[^\x00]` and `(?=\x00)`: a batch joins completions with NUL bytes, and no span crosses one
_TOOL_CALL = re.compile(rb"<tool_call>([^\x00]*?)(?:</tool_call>|(?=\x00)|\Z)")
_MCP = re.compile(rb"<use_mcp_tool>([^\x00]*?)(?:</use_mcp_tool>|(?=\x00)|\Z)")
_MCP_FIELD = re.compile(rb"<(server_name|tool_name|arguments)>([^\x00]*?)(?:</\1>|(?=\x00)|\Z)")
_ANSWER = re.compile(rb"(<answer>)([^\x00]*?)(</answer>|(?=\x00)|\Z)")
_BOXED = re.compile(rb"\\boxed\{")
_THINK_CLOSE = re.compile(rb"</think>")
_THINK = re.compile(rb"(<think>)([^\x00]*?)(</think>|(?=\x00)|\Z)")


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
        if text[j] == 0:
            return None
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
        for close in _THINK_CLOSE.finditer(text):
            start = call_starts[bisect.bisect_right(call_starts, close.start()) - 1]
            if text.find(b"<think>", start, close.start()) < 0:  # the template opened <think>
                add((start, close.start(), REASONING))
                add((close.start(), close.end(), FORMAT))
        for m in _THINK.finditer(text):
            add((m.start(1), m.end(1), FORMAT))
            add((m.start(2), m.end(2), REASONING))
            add((m.start(3), m.end(3), FORMAT))
    if b"<tool_call>" in text:
        for m in _TOOL_CALL.finditer(text):
            add((m.start(), m.end(), FORMAT))
            _label_hermes(text, m.start(1), m.end(1), spans, cfg)
    if b"<use_mcp_tool>" in text:
        for m in _MCP.finditer(text):
            add((m.start(), m.end(), FORMAT))
            for f in _MCP_FIELD.finditer(text, m.start(1), m.end(1)):
                if f.group(1) == b"arguments":
                    _label_json(text, f.start(2), f.end(2), spans, cfg, top_roles=False)
                else:  # server (sub-agent) and tool names are the decision
                    add((f.start(2), f.end(2), ACTION))
    if b"<answer>" in text:
        for m in _ANSWER.finditer(text):
            add((m.start(1), m.end(1), ACTION))
            add((m.start(2), m.end(2), ARGS))
            add((m.start(3), m.end(3), FORMAT))
    if b"\\boxed{" in text:
        for m in _BOXED.finditer(text):
            span = _boxed_span(text, m.start())
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
    _label_free_text(text, labels)
    return labels


def _label_free_text(text: bytes, labels: np.ndarray) -> None:
    """Unlabelled runs are free text: reasoning, except whitespace at either end (format)."""
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
            labels[a + lead:a + body] = REASONING


def _label_native(text: bytes, start: int, end: int, spans: list, native_calls: list[dict[str, Any]]) -> None:
    """Tool calls in a format we do not parse: find the name and the argument values in the
    raw text, in order."""
    pos = start
    for tc in native_calls:
        call = _native_call(tc)
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
