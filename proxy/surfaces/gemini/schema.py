"""Gemini's schema dialect (`Schema`: a function's `parameters`, `responseSchema`) → the JSON
Schema the chat template shows and constrained decoding enforces. Gemini's is an OpenAPI 3.0
subset: types in capitals (`"OBJECT"`, `"STRING"`; any case is taken), `nullable` for a null
alternative, `anyOf`, `propertyOrdering` (Gemini's own: dropped), `example` (→ `examples`), `defs`
and `ref` (→ `$defs`, `$ref`), integer bounds that proto3 JSON may send as strings (`"5"`). A field
Schema does not have is a 400 naming it, as Gemini answers. (`parametersJsonSchema` and
`responseJsonSchema` are JSON Schema already: they are passed on as sent.)"""

from __future__ import annotations

from typing import Any

from harnessrl.proxy.surfaces.gemini.fields import bad, fields, spellings

_FIELDS = spellings("type", "format", "title", "description", "nullable", "enum", "maxItems", "minItems",
                    "properties", "required", "minProperties", "maxProperties", "minLength", "maxLength", "pattern",
                    "example", "anyOf", "propertyOrdering", "default", "items", "minimum", "maximum",
                    "additionalProperties", "defs", "ref")
_TYPES = {"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL", "TYPE_UNSPECIFIED"}
_COUNTS = ("maxItems", "minItems", "minProperties", "maxProperties", "minLength", "maxLength")
_STRINGS = ("format", "title", "description", "pattern")


def json_schema(schema: Any, path: str) -> dict:
    """The JSON Schema for a Gemini `Schema` at `path`."""
    s = fields(schema, path, _FIELDS)
    out: dict[str, Any] = {}
    kind = s.get("type")
    if kind is not None:
        if not isinstance(kind, str) or kind.upper() not in _TYPES:
            raise bad(f"{path}.type", f"must be one of {', '.join(sorted(_TYPES))}")
        if kind.upper() != "TYPE_UNSPECIFIED":
            out["type"] = kind.lower()
    if s.get("nullable") is True and "type" in out:
        out["type"] = [out["type"], "null"]
    for name in _STRINGS:
        if name in s:
            if not isinstance(s[name], str):
                raise bad(f"{path}.{name}", "must be a string")
            out[name] = s[name]
    for name in _COUNTS:
        if name in s:
            out[name] = _count(s[name], f"{path}.{name}")
    for name in ("minimum", "maximum"):
        if name in s:
            v = s[name]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise bad(f"{path}.{name}", "must be a number")
            out[name] = v
    for name in ("enum", "required"):
        if name in s:
            if not isinstance(s[name], list) or not all(isinstance(v, str) for v in s[name]):
                raise bad(f"{path}.{name}", "must be a list of strings")
            out[name] = s[name]
    if "properties" in s:
        props = s["properties"]
        if not isinstance(props, dict):
            raise bad(f"{path}.properties", "must be an object of schemas")
        out["properties"] = {k: json_schema(v, f"{path}.properties[{k!r}]") for k, v in props.items()}
    if "items" in s:
        out["items"] = json_schema(s["items"], f"{path}.items")
    if "anyOf" in s:
        if not isinstance(s["anyOf"], list):
            raise bad(f"{path}.anyOf", "must be a list of schemas")
        out["anyOf"] = [json_schema(v, f"{path}.anyOf[{i}]") for i, v in enumerate(s["anyOf"])]
    if "additionalProperties" in s:
        extra = s["additionalProperties"]
        out["additionalProperties"] = extra if isinstance(extra, bool) else json_schema(
            extra, f"{path}.additionalProperties")
    if "defs" in s:
        if not isinstance(s["defs"], dict):
            raise bad(f"{path}.defs", "must be an object of schemas")
        out["$defs"] = {k: json_schema(v, f"{path}.defs[{k!r}]") for k, v in s["defs"].items()}
    if "ref" in s:
        if not isinstance(s["ref"], str):
            raise bad(f"{path}.ref", "must be a string")
        out["$ref"] = s["ref"]
    if "example" in s:
        out["examples"] = [s["example"]]
    if "default" in s:
        out["default"] = s["default"]
    return out


def _count(v: Any, path: str) -> int:
    if isinstance(v, str) and v.isascii() and v.isdigit():
        v = int(v)  # proto3 JSON writes int64 as a string
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise bad(path, "must be a non-negative integer")
    return v
