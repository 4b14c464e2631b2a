"""An assistant answer as the ordered blocks the Responses and Anthropic surfaces show — reasoning,
text, tool calls — built from a route's `Result`, or incrementally from its `Delta`s while
streaming, with the same split in both cases so a stream ends in the blocks the response holds.

Reasoning is the model's `<think>` block at the start of its content (or the `reasoning` field
an upstream with a reasoning parser fills). `join_think(reasoning, text)` undoes the split: it
gives back the content the model wrote — what a harness sends back (as reasoning items or
thinking blocks) and what the prefix index must find again — for the template's own form
`<think>\n…\n</think>\n\n…`. A think block the model left open, or closed without the blank
line, comes back in that form instead; the prefix index still finds the call it extends
(`prefix.index.same_message` compares think blocks whitespace-insensitively and an open one as closed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harnessrl.proxy.protocol import Delta, Result

THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>"
_GAP = "\n\n"


def join_think(reasoning: str | None, text: str | None) -> str | None:
    """The assistant content for reasoning + text (the inverse of the split)."""
    if reasoning is None:
        return text
    return THINK_OPEN + reasoning + THINK_CLOSE + (_GAP + text if text else "")


def _held_tail(buf: str, marker: str) -> int:
    """Length of the longest end of `buf` that may be the start of `marker`."""
    for n in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:n]):
            return n
    return 0


class ThinkSplitter:
    """Splits growing content into ("reasoning" | "text", piece) pieces."""

    def __init__(self) -> None:
        self.state = "start"  # start | think | gap | text
        self.buf = ""

    def feed(self, s: str) -> list[tuple[str, str]]:
        self.buf += s
        out: list[tuple[str, str]] = []
        while True:
            b = self.buf
            if self.state == "start":
                if THINK_OPEN.startswith(b):
                    return out  # may still open a think block
                if b.startswith(THINK_OPEN):
                    self.state, self.buf = "think", b[len(THINK_OPEN):]
                else:
                    self.state = "text"
            elif self.state == "think":
                cut = b.find(THINK_CLOSE)
                if cut < 0:
                    keep = _held_tail(b, THINK_CLOSE)
                    if len(b) > keep:
                        out.append(("reasoning", b[:len(b) - keep]))
                    self.buf = b[len(b) - keep:]
                    return out
                if cut:
                    out.append(("reasoning", b[:cut]))
                self.state, self.buf = "gap", b[cut + len(THINK_CLOSE):]
            elif self.state == "gap":
                if len(b) < len(_GAP) and _GAP.startswith(b):
                    return out
                self.state = "text"
                self.buf = b[len(_GAP):] if b.startswith(_GAP) else b
            else:
                if b:
                    out.append(("text", b))
                self.buf = ""
                return out

    def finish(self) -> list[tuple[str, str]]:
        b, state = self.buf, self.state
        self.buf = ""
        if state == "think" and b:
            return [("reasoning", b)]
        if state in ("start", "text") and b:
            return [("text", b)]
        return []


def split_think(content: str | None) -> tuple[str | None, str]:
    """(reasoning, text) of finished content, split as a stream of it would be."""
    if not content or not content.startswith(THINK_OPEN):
        return None, content or ""
    sp = ThinkSplitter()
    pieces = sp.feed(content) + sp.finish()
    return "".join(p for k, p in pieces if k == "reasoning"), "".join(p for k, p in pieces if k == "text")


@dataclass(slots=True)
class Block:
    kind: str  # "reasoning" | "text" | "tool"
    text: str = ""  # reasoning / text; a tool call's arguments JSON
    call_id: str | None = None
    name: str | None = None


def blocks_of(r: Result) -> list[Block]:
    """The final blocks of an answer: reasoning, text, then one per tool call."""
    msg = r.message or {}
    reasoning, text = split_think(r.text)
    extra = msg.get("reasoning") or msg.get("reasoning_content")
    if extra:
        reasoning = extra + (reasoning or "")
    out = [Block("reasoning", reasoning)] if reasoning else []
    if text:
        out.append(Block("text", text))
    for tc in r.tool_calls or ():
        fn = tc.get("function") or {}
        out.append(Block("tool", fn.get("arguments") or "", tc.get("id"), fn.get("name")))
    return out


@dataclass(slots=True)
class Event:
    op: str  # "open" | "piece" | "close"
    index: int  # the block's position in the answer
    block: Block
    piece: str = ""


@dataclass
class BlockStream:
    """Deltas → open/piece/close events over the blocks, in the order they appear. A block
    closes when a block of another kind opens, and all at `finish()`."""

    blocks: list[Block] = field(default_factory=list)
    _split: ThinkSplitter = field(default_factory=ThinkSplitter)
    _open: Block | None = None
    _tools: dict[int, Block] = field(default_factory=dict)  # the delta's tool-call index -> block

    def feed(self, deltas: list[Delta]) -> list[Event]:
        ev: list[Event] = []
        for d in deltas:
            if d.reasoning:
                self._piece("reasoning", d.reasoning, ev)
            if d.content:
                for kind, s in self._split.feed(d.content):
                    self._piece(kind, s, ev)
            for tc in d.tool_calls or ():
                fn = tc.get("function") or {}
                b = self._tools.get(tc.get("index", 0))
                if b is None:
                    self._flush(ev)
                    b = self._tools[tc.get("index", 0)] = Block("tool", "", tc.get("id"), fn.get("name"))
                    self._start(b, ev)
                if fn.get("arguments"):
                    b.text += fn["arguments"]
                    ev.append(Event("piece", self.blocks.index(b), b, fn["arguments"]))
        return ev

    def finish(self) -> list[Event]:
        ev: list[Event] = []
        self._flush(ev)
        for b in self.blocks:
            if b is self._open or b.kind == "tool":
                ev.append(Event("close", self.blocks.index(b), b))
        self._open = None
        return ev

    def _flush(self, ev: list[Event]) -> None:
        for kind, s in self._split.finish():
            self._piece(kind, s, ev)

    def _piece(self, kind: str, s: str, ev: list[Event]) -> None:
        b = self._open
        if b is None or b.kind != kind:
            b = Block(kind)
            self._start(b, ev)
        b.text += s
        ev.append(Event("piece", self.blocks.index(b), b, s))

    def _start(self, b: Block, ev: list[Event]) -> None:
        if self._open is not None:
            ev.append(Event("close", self.blocks.index(self._open), self._open))
        self.blocks.append(b)
        ev.append(Event("open", len(self.blocks) - 1, b))
        self._open = b if b.kind != "tool" else None
