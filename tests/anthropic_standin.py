"""A local stand-in for a hosted Anthropic model: the Messages wire format (`POST /v1/messages`,
streamed and not, Anthropic's SSE events and error shape), an `x-api-key` check and a required
`anthropic-version` header — and, like the hosted API, no token ids and no log-probs.

Its "model" is a script: with tools and a user question last, it calls the first tool with
`{"query": <the question's last word, unquoted>}`; after a tool result it answers
`The answer is <answer>RESULT</answer>.`; otherwise it echoes. Every request it took is kept in `requests`.
"""

from __future__ import annotations

import json
import uuid

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def _error(status: int, kind: str, message: str) -> Response:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status)


def _reply(body: dict) -> tuple[list[dict], str]:
    last = body["messages"][-1]
    blocks = last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
    results = [b for b in blocks if b.get("type") == "tool_result"]
    if results:
        content = results[-1]["content"]
        text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
        return [{"type": "text", "text": f"The answer is <answer>{text}</answer>."}], "end_turn"
    question = " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    if body.get("tools"):
        words = question.rstrip("?.! ").split() or [""]
        return [{"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", "name": body["tools"][0]["name"],
                 "input": {"query": words[-1].strip("'\"")}}], "tool_use"
    return [{"type": "text", "text": f"You said: {question}"}], "end_turn"


def create_app(api_key: str) -> tuple[Starlette, list[dict]]:
    """The app and the list of requests it took (body and headers)."""
    requests: list[dict] = []

    async def messages(request: Request) -> Response:
        if request.headers.get("x-api-key") != api_key:
            return _error(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return _error(400, "invalid_request_error", "anthropic-version header is required")
        body = await request.json()
        if not isinstance(body.get("max_tokens"), int) or not body.get("messages"):
            return _error(400, "invalid_request_error", "max_tokens and messages are required")
        requests.append({"body": body, "headers": dict(request.headers)})
        content, stop = _reply(body)
        n_in = sum(len(json.dumps(m)) for m in body["messages"]) // 4
        n_out = sum(len(json.dumps(b)) for b in content) // 4
        msg = {"id": f"msg_{uuid.uuid4().hex[:16]}", "type": "message", "role": "assistant", "model": body["model"],
               "content": content, "stop_reason": stop, "stop_sequence": None,
               "usage": {"input_tokens": n_in, "output_tokens": n_out}}
        if not body.get("stream"):
            return JSONResponse(msg)
        return StreamingResponse(_events(msg), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        if request.headers.get("x-api-key") != api_key:
            return _error(401, "authentication_error", "invalid x-api-key")
        return JSONResponse({"data": [{"type": "model", "id": "claude-standin"}], "has_more": False})

    return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"]),
                             Route("/v1/models", models, methods=["GET"])]), requests


def _sse(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


async def _events(msg: dict):
    yield _sse("message_start", {"message": {**msg, "content": [], "stop_reason": None,
                                             "usage": {"input_tokens": msg["usage"]["input_tokens"],
                                                       "output_tokens": 1}}})
    yield _sse("ping", {})
    for i, block in enumerate(msg["content"]):
        if block["type"] == "text":
            yield _sse("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
            words = block["text"].split(" ")
            for j, w in enumerate(words):
                piece = w if j == 0 else " " + w
                yield _sse("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": piece}})
        else:
            yield _sse("content_block_start", {"index": i, "content_block": {**block, "input": {}}})
            raw = json.dumps(block["input"])
            for j in range(0, len(raw), 5):
                yield _sse("content_block_delta", {"index": i, "delta": {"type": "input_json_delta",
                                                                         "partial_json": raw[j:j + 5]}})
        yield _sse("content_block_stop", {"index": i})
    yield _sse("message_delta", {"delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                                 "usage": {"output_tokens": msg["usage"]["output_tokens"]}})
    yield _sse("message_stop", {})
