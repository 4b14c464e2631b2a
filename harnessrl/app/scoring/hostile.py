"""Data that came out of a sandbox, made safe for the host: everything there is the agent's to shape.

A report, an answer, a file name or an output is read with a size and a nesting limit
(`loads`, one `HostileData` for every way it can be wrong: too big, too deep, not JSON, not
UTF-8), and only text that encodes goes into a reward's metadata (`safe_text`, `safe_meta`): a
file name that is not valid UTF-8 reaches Python as lone surrogates, which the JSON the reward
is posted as cannot carry (issue 54: such a name crashed the reward post and, under `loop`,
the whole loop).
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 64  # nesting of a JSON document read back: Python's parser recurses, and a deep one raises


class HostileData(ValueError):
    """What came back cannot be read as the data it should be; the message says why, in one line."""


def _depth(text: str, limit: int) -> None:
    """Raises when brackets nest deeper than `limit`, outside strings: before the parser recurses."""
    depth, in_str, escaped = 0, False, False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                raise HostileData(f"nested deeper than {limit}")
        elif ch in "]}":
            depth -= 1


def loads(raw: bytes | str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON document of at most `max_bytes` bytes and `max_depth` levels, or `HostileData`."""
    if len(raw) > max_bytes:
        raise HostileData(f"larger than {max_bytes} bytes")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise HostileData("not UTF-8") from None
    _depth(text, max_depth)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise HostileData(f"not JSON ({str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__})") from None


def safe_text(text: str, limit: int | None = None) -> str:
    """`text` as valid UTF-8: lone surrogates (an undecodable byte of a file name, a \\ud800 in a
    JSON string) become backslash escapes; cut to `limit` characters."""
    out = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return out if limit is None or len(out) <= limit else out[:limit] + "…"


def safe_meta(value: Any, depth: int = 0) -> Any:
    """A copy of reward metadata that JSON encodes whatever strings or keys are in it."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # the reward post is strict JSON: no NaN, no Infinity
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return value
    if depth > MAX_DEPTH:
        return "…"
    if isinstance(value, dict):
        return {safe_text(str(k)): safe_meta(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [safe_meta(v, depth + 1) for v in value]
    return safe_text(repr(value), 200)
