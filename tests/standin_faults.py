"""The stand-in's answers that end as if complete but are not (issue 30): vLLM's streaming error
event mid-stream, no finish reason, finish reason "abort", a non-SSE or HTML body, a cut event.
tests/vllm_standin.py picks one by model name or by "[fault:NAME]" in the prompt."""

from __future__ import annotations

import re

import orjson
from starlette.responses import Response

FAULTS = ("error-mid-stream", "no-finish", "abort", "non-sse", "garbage", "truncated-json")
WHOLE_BODY_FAULTS = ("non-sse", "garbage")  # the same answer streamed or not
_MARKER = re.compile(r"\[fault:([a-z-]+)\]")
# vLLM's streaming error event (serving_chat's create_streaming_error_response)
_STREAM_ERROR = {"error": {"message": "injected engine failure mid-stream", "type": "InternalServerError",
                           "param": None, "code": 500}}


def fault_of(model: str, prompt: str) -> str | None:
    if model in FAULTS:
        return model
    found = _MARKER.search(prompt) if "[fault:" in prompt else None
    return found.group(1) if found and found.group(1) in FAULTS else None


def fault_body(fault: str) -> Response:
    if fault == "non-sse":
        return Response(b'{"choices":[]}', media_type="application/json")
    return Response(b"<html><body><h1>502 Bad Gateway</h1></body></html>\n", media_type="text/html")


def answer(body: dict, fault: str | None) -> Response:
    """A whole (non-stream) answer, broken the way `fault` says."""
    if fault == "error-mid-stream":
        return Response(orjson.dumps(_STREAM_ERROR), media_type="application/json")
    if fault in ("no-finish", "abort"):
        for ch in body["choices"]:
            ch["finish_reason"] = None if fault == "no-finish" else "abort"
    data = orjson.dumps(body)
    return Response(data[: len(data) // 2] if fault == "truncated-json" else data, media_type="application/json")


def faulty(events, fault: str | None):
    """The SSE events of a stream, broken the way `fault` says."""
    return events if fault is None else _broken(events, fault)


async def _broken(events, fault: str):
    n = 0
    async for event in events:
        n += 1
        if fault == "error-mid-stream" and n == 3:
            yield b"data: " + orjson.dumps(_STREAM_ERROR) + b"\n\n"
            yield b"data: [DONE]\n\n"
            return
        if fault == "truncated-json" and n == 3:
            yield event[: len(event) // 2]
            return
        if fault in ("no-finish", "abort") and event.startswith(b"data: {"):
            chunk = orjson.loads(event[6:])
            for ch in chunk.get("choices") or []:
                if ch.get("finish_reason"):
                    ch["finish_reason"] = None if fault == "no-finish" else "abort"
            event = b"data: " + orjson.dumps(chunk) + b"\n\n"
        yield event
