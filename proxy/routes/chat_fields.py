"""What a token route (the proxy renders the prompt itself) does with chat fields a chat
template cannot say for itself: the `developer` role, and content parts that are not text."""

from __future__ import annotations

from typing import Any

from harnessrl.proxy.errors import bad_request

# parts a text-only model cannot see (a template would drop them without a word)
_MEDIA = {"image_url", "input_image", "image", "input_audio", "audio", "file", "input_file", "video_url", "video"}


def check_text_only(messages: list[dict], model: str) -> None:
    """A 400 naming the first image, audio or file part: the served model reads text only."""
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in _MEDIA:
                raise bad_request(f"messages[{i}].content[{j}] is an '{kind}' part, but the model {model} reads "
                                  "text only: send text parts", param=f"messages[{i}].content[{j}]",
                                  code="unsupported_content")


def developer_as_system(template: Any) -> bool:
    """Whether `developer` messages must be rendered as `system` ones: the template has no
    developer role (OpenAI's developer messages are the system messages of newer models)."""
    return "developer" not in (template if isinstance(template, str) else str(template or ""))


def map_developer(messages: list[dict]) -> list[dict]:
    if not any(m.get("role") == "developer" for m in messages):
        return messages
    return [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]
