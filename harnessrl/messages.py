"""Chat-message helpers shared by the proxy (prefix index) and the compiler (expert traces)."""

from __future__ import annotations

from typing import Any


def content_text(content: Any) -> str:
    """The text of a message's `content`: a string as is, OpenAI content parts joined (non-text
    parts contribute nothing), None as ""."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text", ""), str))
    return content if isinstance(content, str) else ""
