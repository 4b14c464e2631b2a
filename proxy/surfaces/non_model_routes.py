"""The surfaces' endpoints that serve no model call (nothing is recorded):
`GET /v1/responses/{id}` (a stored Responses object of the caller's rollout) and `POST /v1/messages/count_tokens` (the
prompt's size with the route's tokenizer), also under /r/{rollout}/a/{agent}; count_tokens also
without /v1, where clients that append only `/messages` to the base URL send it (the Vercel AI SDK).

count_tokens renders the translated chat prompt exactly as a call would (chat template, tools).
A pass-through route has no tokenizer — the upstream renders its own prompts — so there it is a
501 saying so (run the proxy in prefix mode, with --tokenizer, to have one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from harnessrl.proxy.surfaces.anthropic import wire as anthropic_wire
from harnessrl.proxy.surfaces.anthropic.request import translate
from harnessrl.proxy.errors import BackendRejected, ProxyError, error_response
from harnessrl.proxy.identity import check_auth, check_scope, identify, reader_scope
from harnessrl.proxy.surfaces.responses.stored import StoredCalls
from harnessrl.proxy.validate import parse_json


def _json(obj: Any) -> Response:
    return Response(orjson.dumps(obj), 200, media_type="application/json")


async def count_tokens(route: Any, chat: dict) -> int:
    prompter = getattr(route, "prompter", None)
    if prompter is None:
        raise ProxyError(501, "count_tokens needs the model's tokenizer, and this proxy forwards to an upstream "
                              "that renders its own prompts (run it with --prefix --tokenizer DIR)",
                         "api_error", code="not_supported")
    try:
        return len(await route.off_loop(prompter.render, chat["messages"], chat.get("tools")))
    except Exception as exc:  # noqa: BLE001 - e.g. a template that rejects the messages
        raise BackendRejected(f"cannot render the messages with the chat template: {exc}",
                              code="template_error") from None


def add_surface_routes(app: FastAPI, api_key: str | None, route: Callable[[], Any], stored: StoredCalls) -> None:
    """`route()`: the serving route (known once the app has started)."""

    async def get_response(request: Request) -> Response:
        try:
            key_scope = check_auth(request.headers, api_key)
            ident = identify(request.path_params, request.headers, api_key)
            check_scope(key_scope, ident.rollout)
            scope = reader_scope(ident, request.headers, api_key)
            return _json(await stored.response(request.path_params["response_id"], scope))
        except ProxyError as err:
            return error_response(err)

    async def messages_count_tokens(request: Request) -> Response:
        try:
            check_auth(request.headers, api_key)
            chat = translate(parse_json(await request.body()))
            return _json({"input_tokens": await count_tokens(route(), chat)})
        except ProxyError as err:
            return anthropic_wire.error_response(err)

    for prefix in ("", "/r/{rollout}/a/{agent}"):
        app.add_route(prefix + "/v1/responses/{response_id}", get_response, methods=["GET"])
        for v1 in ("/v1", ""):
            app.add_route(prefix + v1 + "/messages/count_tokens", messages_count_tokens, methods=["POST"])
