"""The Gemini API, request side: a `generateContent` / `streamGenerateContent` / `countTokens`
body (the model named by the path), checked with errors that name its own fields the way Gemini
does (`contents[1].parts[0].functionCall.args`), translated to the internal chat body. Every field
is translated by one of these rules or refused with a 400 naming it — none is dropped unseen:

- `systemInstruction` (its text parts, joined by newlines) becomes the first system message;
- a `model` turn's `thought` text parts, text parts and `functionCall` parts one assistant message
  (thought joined back into the content as the model wrote it, `surfaces.blocks.join_think`;
  sent back without its thought parts, the reasoning is the one its `thoughtSignature` carries
  when the proxy made it, `surfaces.gemini.thoughts`; any other signature is not checked); a
  call's `id` is its tool-call id (the proxy's answers carry one), one without an id gets
  `<name>_<turn>_<part>`;
- a `user` turn's `functionResponse` parts tool messages, answering the call with their `id` or,
  without one, the earliest unanswered call of that name (a `response` of only `output` is that
  text, of only `error` "Error: " and that text, any other its JSON); its text parts (joined by
  newlines) and images as `inlineData` / `fileData`, the user message (the role `function` of
  older clients is `user`);
- tools, `toolConfig`: `surfaces.gemini.tools`;
- `generationConfig`: `temperature`, `topP`, `topK`, `maxOutputTokens`, `stopSequences` (→ stop),
  `seed`, `presencePenalty`, `frequencyPenalty`, `responseLogprobs` + `logprobs` (→ logprobs +
  top_logprobs); `responseMimeType: application/json` with `responseSchema` (Gemini's dialect) or
  `responseJsonSchema` → a json_schema `response_format`, without either → json_object;
  `candidateCount` 1 (more: one request per candidate); `responseModalities` TEXT only;
- recorded with the call and otherwise ignored: `safetySettings` (the proxy filters nothing),
  `thinkingConfig` (the model thinks as its template lets it; its thoughts always come back, as
  thought parts and in a `thoughtSignature`, so the next call extends this one), `labels`, `serviceTier`,
  `store`, `mediaResolution`, `enableEnhancedCivicAnswers`. Refused: `cachedContent` (nothing is
  cached here; the prefix index reuses prompts without it), `speechConfig`, `imageConfig`, code
  execution parts, audio and video.
"""

from __future__ import annotations

import json
from typing import Any

from harnessrl.proxy.protocol import Request
from harnessrl.proxy.surfaces.blocks import join_think
from harnessrl.proxy.surfaces.gemini.fields import (at, bad, boolean, fields, integer, listed, number, spellings,
                                                    string)
from harnessrl.proxy.surfaces.gemini.schema import json_schema
from harnessrl.proxy.surfaces.gemini.thoughts import unsign
from harnessrl.proxy.surfaces.gemini.tools import tool_choice, tools
from harnessrl.proxy.surfaces.hosted_tools import Removed
from harnessrl.proxy.validate import check_chat, valid_model

_BODY = spellings("contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings",
                  "cachedContent", "labels", "serviceTier", "store", "model")
_COUNT = spellings("contents", "generateContentRequest")
_CONTENT = spellings("role", "parts")
_PART = spellings("text", "thought", "thoughtSignature", "inlineData", "fileData", "functionCall",
                  "functionResponse", "executableCode", "codeExecutionResult", "videoMetadata", "partMetadata",
                  "mediaResolution")
_CALL = spellings("id", "name", "args")
_RESPONSE = spellings("id", "name", "response", "parts", "willContinue", "scheduling")
_BLOB = spellings("mimeType", "data", "displayName")
_FILE = spellings("mimeType", "fileUri", "displayName")
_GENERATION = spellings("stopSequences", "responseMimeType", "responseSchema", "responseJsonSchema",
                        "responseModalities", "candidateCount", "maxOutputTokens", "temperature", "topP", "topK",
                        "seed", "presencePenalty", "frequencyPenalty", "responseLogprobs", "logprobs",
                        "enableEnhancedCivicAnswers", "speechConfig", "thinkingConfig", "mediaResolution",
                        "imageConfig")
_THINKING = spellings("includeThoughts", "thinkingBudget", "thinkingLevel")
_DATA = ("text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode",
         "codeExecutionResult")
INT32 = 2 ** 31 - 1


def to_request(body: dict, strict_tools: bool = False, *, model: str, method: str, alt: str) -> Request:
    """The chat `Request` for a `generateContent` (or, `method` "streamGenerateContent", streamed)
    body, for `model` from the path; `alt`: the stream's form ("sse", or "json": one JSON array).
    Hosted tools removed (recorded in its notes) or, with `strict_tools`, refused."""
    removed = Removed(strict_tools)
    chat = translate(body, model, removed)
    chat["stream"] = method == "streamGenerateContent"
    check_chat(chat)
    surface = {"api": "gemini", "model": model, "method": method, "body": body}
    if chat["stream"]:
        surface["alt"] = alt
    return Request(chat, surface=surface, notes=removed.notes())


def count_request(body: Any, model: str) -> dict:
    """The chat body of a `countTokens` body: `contents`, or a whole `generateContentRequest`."""
    b = fields(body, "", _COUNT)
    if "generateContentRequest" in b:
        if "contents" in b:
            raise bad("contents", "only one of contents and generateContentRequest may be set")
        return translate(b["generateContentRequest"], model, Removed(), "generateContentRequest", count=True)
    return translate({"contents": b.get("contents")}, model, Removed(), count=True)


def translate(body: Any, model: str, removed: Removed, path: str = "", count: bool = False) -> dict:
    if not valid_model(model):
        raise bad("model", "the model named in the path must be at most 256 characters, no control characters")
    b = fields(body, path, _BODY)
    if "cachedContent" in b:
        raise bad(at(path, "cachedContent"), "cached contents are not supported by this proxy (send the contents; "
                                             "its prefix index reuses the shared prompt)")
    if b.get("model") is not None and not isinstance(b["model"], str):
        raise bad(at(path, "model"), "must be a string")
    declared = tools(listed(b, "tools", path), removed)
    contents = listed(b, "contents", path)
    if not contents:
        raise bad(at(path, "contents"), "is required (a non-empty list of Content)")
    messages: list[dict] = []
    if "systemInstruction" in b:
        system = _system(b["systemInstruction"], at(path, "systemInstruction"))
        if system:
            messages.append({"role": "system", "content": system})
    pending: list[tuple[str, str]] = []  # the last model turn's calls not yet answered: (name, id)
    roles = []
    for i, c in enumerate(contents):
        p = f"{at(path, 'contents')}[{i}]"
        content = fields(c, p, _CONTENT)
        role = content.get("role", "user")
        if role not in ("user", "model", "function"):
            raise bad(f"{p}.role", "must be 'user' or 'model'")
        parts = listed(content, "parts", p)
        if not parts:
            raise bad(f"{p}.parts", "is required (a non-empty list of Part)")
        roles.append(role)
        if role == "model":
            msg, pending = _model(parts, p, i)
            messages.append(msg)
        else:
            messages += _user(parts, p, pending)
    if not count and roles[-1] == "model":
        raise bad(f"{at(path, 'contents')}[{len(roles) - 1}].role",
                  "a final model turn (prefill) is not supported by this proxy")
    chat: dict[str, Any] = {"model": model, "messages": messages}
    if declared.shown:
        chat["tools"] = declared.shown
    if "toolConfig" in b:
        chat.update(tool_choice(b["toolConfig"], declared.shown))
    if "safetySettings" in b and not isinstance(b["safetySettings"], list):
        raise bad(at(path, "safetySettings"), "must be a list")
    if "generationConfig" in b:
        chat.update(generation(b["generationConfig"], at(path, "generationConfig")))
    return chat


def _text_parts(parts: list, p: str) -> str:
    out = []
    for j, part in enumerate(parts):
        f = fields(part, f"{p}.parts[{j}]", _PART)
        text = string(f, "text", f"{p}.parts[{j}]")
        if text is None or any(k in f for k in _DATA if k != "text"):
            raise bad(f"{p}.parts[{j}]", "only text parts are supported here")
        out.append(text)
    return "\n".join(out)


def _system(instruction: Any, p: str) -> str:
    content = fields(instruction, p, _CONTENT)
    return _text_parts(listed(content, "parts", p), p)


def _data(f: dict, p: str) -> str:
    """The one data field of a part (Gemini's `data` oneof)."""
    present = [k for k in _DATA if k in f]
    if len(present) != 1:
        raise bad(p, "a part must hold exactly one of " + ", ".join(_DATA))
    return present[0]


def _model(parts: list, p: str, turn: int) -> tuple[dict, list[tuple[str, str]]]:
    thinking: list[str] = []
    texts: list[str] = []
    calls: list[dict] = []
    signed = None  # the reasoning a thoughtSignature of the proxy's carries (`surfaces.gemini.thoughts`)
    for j, part in enumerate(parts):
        q = f"{p}.parts[{j}]"
        f = fields(part, q, _PART)
        kind = _data(f, q)
        signed = signed or unsign(f.get("thoughtSignature"))
        if kind == "text":
            text = string(f, "text", q)
            (thinking if boolean(f, "thought", q) else texts).append(text)
        elif kind == "functionCall":
            fc = fields(f["functionCall"], f"{q}.functionCall", _CALL)
            name = string(fc, "name", f"{q}.functionCall", required=True)
            args = fc.get("args", {})
            if not isinstance(args, dict):
                raise bad(f"{q}.functionCall.args", "must be an object")
            call_id = string(fc, "id", f"{q}.functionCall") or f"{name}_{turn}_{j}"
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
        else:
            raise bad(f"{q}.{kind}", "is not supported in a model turn here (text, thought and functionCall are)")
    reasoning = "".join(thinking) if thinking else signed
    content = join_think(reasoning, "".join(texts))
    msg: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    return msg, [(c["function"]["name"], c["id"]) for c in calls]


def _user(parts: list, p: str, pending: list[tuple[str, str]]) -> list[dict]:
    out: list[dict] = []
    media: list[dict] = []

    def flush() -> None:
        if media:
            text_only = all(m["type"] == "text" for m in media)
            # text parts joined by newlines: Gemini CLI sends its session context and the prompt as two
            out.append({"role": "user", "content": "\n".join(m["text"] for m in media) if text_only else list(media)})
            media.clear()

    for j, part in enumerate(parts):
        q = f"{p}.parts[{j}]"
        f = fields(part, q, _PART)
        kind = _data(f, q)
        if f.get("thought"):
            raise bad(f"{q}.thought", "thought parts belong to model turns")
        if kind == "text":
            media.append({"type": "text", "text": string(f, "text", q)})
        elif kind == "functionResponse":
            flush()
            out.append(_tool_message(f["functionResponse"], f"{q}.functionResponse", pending))
        elif kind in ("inlineData", "fileData"):
            media.append({"type": "image_url", "image_url": {"url": _image(f[kind], f"{q}.{kind}", kind)}})
        else:
            raise bad(f"{q}.{kind}", "is not supported in a user turn here (text, inlineData, fileData and "
                                     "functionResponse are)")
    flush()
    return out


def _tool_message(value: Any, p: str, pending: list[tuple[str, str]]) -> dict:
    fr = fields(value, p, _RESPONSE)
    name = string(fr, "name", p, required=True)
    if fr.get("parts"):
        raise bad(f"{p}.parts", "parts in a function response are not supported by this proxy (a chat tool "
                                "message holds text)")
    response = fr.get("response")
    if not isinstance(response, dict):
        raise bad(f"{p}.response", "is required (an object)")
    call_id = string(fr, "id", p)
    if call_id is None:
        call_id = next((cid for n, cid in pending if n == name), f"{name}_result")
    pending[:] = [(n, cid) for n, cid in pending if cid != call_id]
    if set(response) == {"output"}:
        out = response["output"]
        text = out if isinstance(out, str) else json.dumps(out, ensure_ascii=False)
    elif set(response) == {"error"}:
        err = response["error"]
        text = "Error: " + (err if isinstance(err, str) else json.dumps(err, ensure_ascii=False))
    else:
        text = json.dumps(response, ensure_ascii=False)
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _image(value: Any, p: str, kind: str) -> str:
    f = fields(value, p, _BLOB if kind == "inlineData" else _FILE)
    mime = string(f, "mimeType", p, required=kind == "inlineData") or ""
    if mime and not mime.startswith("image/"):
        raise bad(f"{p}.mimeType", f"{mime!r}: only images are supported by this proxy")
    if kind == "inlineData":
        return f"data:{mime};base64,{string(f, 'data', p, required=True)}"
    return string(f, "fileUri", p, required=True)  # type: ignore[return-value]


def generation(config: Any, p: str) -> dict:
    """The chat sampling fields of a `generationConfig`."""
    g = fields(config, p, _GENERATION)
    out: dict[str, Any] = {}
    for src, dst, value in (
        ("temperature", "temperature", number(g, "temperature", p, 0, 2)),
        ("topP", "top_p", number(g, "topP", p, 0, 1, low_open=True)),
        ("topK", "top_k", integer(g, "topK", p, 0, INT32)),
        ("maxOutputTokens", "max_tokens", integer(g, "maxOutputTokens", p, 1, INT32)),
        ("seed", "seed", integer(g, "seed", p, -INT32 - 1, INT32)),
        ("presencePenalty", "presence_penalty", number(g, "presencePenalty", p, -2, 2)),
        ("frequencyPenalty", "frequency_penalty", number(g, "frequencyPenalty", p, -2, 2)),
    ):
        if value is not None:
            out[dst] = value
    stops = listed(g, "stopSequences", p)
    if len(stops) > 4 or not all(isinstance(s, str) for s in stops):
        raise bad(f"{p}.stopSequences", "must be a list of at most 4 strings")
    if stops:
        out["stop"] = stops
    if integer(g, "candidateCount", p, 1, 8) not in (None, 1):
        raise bad(f"{p}.candidateCount", "more than one candidate is not supported by this proxy (send one "
                                         "request per candidate)")
    for k, m in enumerate(listed(g, "responseModalities", p)):
        if not isinstance(m, str) or m.upper() != "TEXT":
            raise bad(f"{p}.responseModalities[{k}]", "only TEXT is supported by this proxy")
    for name in ("speechConfig", "imageConfig"):
        if name in g:
            raise bad(f"{p}.{name}", "is not supported by this proxy (text only)")
    if "thinkingConfig" in g:
        fields(g["thinkingConfig"], f"{p}.thinkingConfig", _THINKING)
    if boolean(g, "responseLogprobs", p):
        out["logprobs"] = True
        k = integer(g, "logprobs", p, 0, 20)
        if k:
            out["top_logprobs"] = k
    elif g.get("logprobs"):
        raise bad(f"{p}.logprobs", "needs responseLogprobs: true")
    out.update(_response_format(g, p))
    return out


def _response_format(g: dict, p: str) -> dict:
    mime = string(g, "responseMimeType", p)
    schema = g.get("responseSchema")
    raw = g.get("responseJsonSchema")
    if schema is not None and raw is not None:
        raise bad(f"{p}.responseJsonSchema", "only one of responseSchema and responseJsonSchema may be set")
    if mime in (None, "text/plain"):
        if schema is not None or raw is not None:
            raise bad(f"{p}.responseMimeType", "a response schema needs responseMimeType 'application/json'")
        return {}
    if mime != "application/json":
        raise bad(f"{p}.responseMimeType", f"{mime!r} is not supported by this proxy (text/plain and "
                                           "application/json are)")
    if schema is not None:
        js = json_schema(schema, f"{p}.responseSchema")
    elif raw is not None:
        if not isinstance(raw, dict):
            raise bad(f"{p}.responseJsonSchema", "must be a JSON Schema object")
        js = raw
    else:
        return {"response_format": {"type": "json_object"}}
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "response", "schema": js}}}
