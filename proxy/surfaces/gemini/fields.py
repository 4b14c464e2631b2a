"""Reading a Gemini request body as the Gemini API does: proto3 JSON, where every field may be
spelled in lowerCamelCase (`systemInstruction`, what the SDKs send) or in its proto name
(`system_instruction`, what Google's curl examples send), a null field is an absent one, and a
field the message does not have is a 400 naming it (`Unknown name "x" at 'contents[0]'`)."""

from __future__ import annotations

import re
from typing import Any

from harnessrl.proxy.errors import ProxyError, bad_request
from harnessrl.proxy.validate import is_int, is_num


def bad(path: str, message: str) -> ProxyError:
    """A 400 about the field at `path` (`contents[0].parts[1].text`)."""
    return bad_request(f"Invalid value at '{path}': {message}" if path else message, param=path or None)


def spellings(*camel: str) -> dict[str, str]:
    """Each accepted spelling of the `camel` fields → its lowerCamelCase name."""
    out = {}
    for name in camel:
        out[name] = name
        out[re.sub(r"([A-Z])", r"_\1", name).lower()] = name
    return out


def fields(obj: Any, path: str, known: dict[str, str]) -> dict[str, Any]:
    """`obj`'s non-null fields by their lowerCamelCase name (`known`: from `spellings`); a 400 for
    a field it does not have, for both spellings of one field, and for anything not an object."""
    if not isinstance(obj, dict):
        raise bad(path, "must be an object")
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = known.get(key)
        if name is None:
            at = f" at '{path}'" if path else ""
            raise bad_request(f'Invalid JSON payload received. Unknown name "{key}"{at}: Cannot find field.',
                              param=f"{path}.{key}" if path else key)
        if name in out:
            raise bad(f"{path}.{name}" if path else name, "given twice (as camelCase and as snake_case)")
        if value is not None:
            out[name] = value
    return out


def at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def string(obj: dict, name: str, path: str, required: bool = False) -> str | None:
    v = obj.get(name)
    if v is None and not required:
        return None
    if not isinstance(v, str):
        raise bad(at(path, name), "must be a string" if v is not None else "is required")
    return v


def number(obj: dict, name: str, path: str, low: float, high: float, low_open: bool = False) -> float | None:
    v = obj.get(name)
    if v is None:
        return None
    if not is_num(v) or not (low < v if low_open else low <= v) or v > high:
        lo = "(" if low_open else "["
        raise bad(at(path, name), f"must be a number in {lo}{low:g}, {high:g}]")
    return v


def integer(obj: dict, name: str, path: str, low: int, high: int) -> int | None:
    v = obj.get(name)
    if v is None:
        return None
    if not is_int(v) or not low <= v <= high:
        raise bad(at(path, name), f"must be an integer in [{low}, {high}]")
    return v


def boolean(obj: dict, name: str, path: str) -> bool | None:
    v = obj.get(name)
    if v is not None and not isinstance(v, bool):
        raise bad(at(path, name), "must be a boolean")
    return v


def listed(obj: dict, name: str, path: str) -> list:
    v = obj.get(name)
    if v is None:
        return []
    if not isinstance(v, list):
        raise bad(at(path, name), "must be a list")
    return v
