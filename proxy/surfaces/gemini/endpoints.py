"""The Gemini API's paths, answered as Gemini answers them: `POST …/v1beta/models/{model}:generateContent`
and `:streamGenerateContent` (`?alt=sse`: server-sent events; without it one JSON array) through
the hot path (`model_endpoints.ModelEndpoints.serve`, as every model call), `:countTokens` (the
prompt the call would get, rendered with the route's tokenizer), `GET …/v1beta/models[/{model}]`
(the one served model, under any name asked for: every name is served by it). Also under
`/r/{rollout}/a/{agent}` (and `/k/<tag>/r/…`, `identity.key_in_path`), and `v1alpha` or `v1` for
`v1beta`, as the SDKs' `api_version` makes them.

The key comes as Gemini's clients send it — `x-goog-api-key`, or `?key=` in the URL — and is
handed on as the `x-api-key` the proxy checks (`identity.check_auth`; an `Authorization` header,
the key in a rollout's base URL, still wins); `?key=` is taken out of the query string, so no log
line or record holds it. Any other path under `/v1beta/` is a Gemini-shaped 404 rather than the
web framework's, and a model method that is not served (`:embedContent`, …) is a 404 recorded in
its rollout as a failed call.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache, partial
from typing import Any
from urllib.parse import parse_qsl, urlencode

import orjson
from starlette.responses import Response

from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.identity import check_auth, check_scope, identify
from harnessrl.proxy.limits import read_body
from harnessrl.proxy.surfaces.adapter import Adapter
from harnessrl.proxy.surfaces.gemini.request import count_request
from harnessrl.proxy.surfaces.gemini.wire import error_response
from harnessrl.proxy.surfaces.non_model_routes import count_tokens
from harnessrl.proxy.validate import parse_json

log = logging.getLogger("harnessrl.proxy")

_PATH = re.compile(r"^(?:/r/(?P<rollout>[^/]+)/a/(?P<agent>[^/]+))?/(?P<version>v1beta|v1alpha|v1)(?P<rest>/.*)?\Z",
                   re.S)
# a Gemini version segment behind a prefix that is not a rollout's (`/r//a/x/v1beta/…`): a 404
_ELSEWHERE = re.compile(r"^/r/[^/]*/a/.*?/v1(?:beta|alpha)(?:/|\Z)", re.S)
_MODEL = re.compile(r"^/models/(?P<model>[^/:]+)(?::(?P<method>[A-Za-z]+))?/?\Z")
GENERATE = ("generateContent", "streamGenerateContent")
_METHODS = [*GENERATE, "countTokens"]
_KEY_HEADERS = (b"x-goog-api-key", b"x-api-key")


def not_served(what: str) -> ProxyError:
    return ProxyError(404, f"{what} is not an endpoint the recording proxy serves (it serves models/{{model}}:"
                           "generateContent, :streamGenerateContent and :countTokens, and GET models)",
                      "not_found", code="unknown_endpoint")


def _unknown_method(body: dict, strict_tools: bool = False, *, model: str, method: str, alt: str):
    raise not_served(f"models/{model}:{method}")


@lru_cache(maxsize=256)
def _adapter(base: Adapter, model: str, method: str, alt: str) -> Adapter:
    # one per (model, method, stream form): the path names what the body does not
    request = base.request if method in GENERATE else _unknown_method
    return replace(base, request=partial(request, model=model, method=method, alt=alt))


def _with_key(scope: dict) -> dict:
    """`scope` with the Gemini key (`x-goog-api-key`, else `?key=`) as `x-api-key`, and no `key` in
    its query string."""
    headers = scope["headers"]
    key = next((v for k, v in headers if k == b"x-goog-api-key"), None)
    query = scope.get("query_string", b"")
    if b"key=" in query:
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
        if key is None:
            key = next((v.encode("latin-1") for k, v in pairs if k == "key"), None)
        query = urlencode([(k, v) for k, v in pairs if k != "key"]).encode("latin-1")
    if key is None:
        return scope
    kept = [(k, v) for k, v in headers if k not in _KEY_HEADERS]
    return {**scope, "headers": [*kept, (b"x-api-key", key)], "query_string": query}


class GeminiEndpoints:
    """The Gemini paths of one app: `hot` is the model calls' handler, `adapter` the Gemini
    surface (`wire.GEMINI`, with --strict-tools applied), `route()` the serving route."""

    def __init__(self, hot, adapter: Adapter, api_key: str | None, max_body: int,
                 route: Callable[[], Any]) -> None:
        self.hot, self.adapter, self.api_key, self.max_body, self.route = hot, adapter, api_key, max_body, route

    def match(self, scope: dict) -> re.Match | None:
        """The path's parts if the request is Gemini's: anything under /v1beta or /v1alpha (but
        Gemini's OpenAI-compatible /v1beta/openai/), /v1/models/{model}:{method}, and (the
        google-genai SDK's default version is v1) `GET /v1/models[/{model}]` sent with a Gemini
        key — without one, /v1/models is OpenAI's list."""
        m = _PATH.match(scope["path"])
        if m is None:
            return _NOWHERE if _ELSEWHERE.search(scope["path"]) else None
        rest = m["rest"] or ""
        if m["version"] == "v1":
            found = _MODEL.match(rest) or (m if rest.rstrip("/") == "/models" else None)
            if found is None:
                return None
            if ":" in rest or b"key=" in scope.get("query_string", b"") or any(
                    k == b"x-goog-api-key" for k, _ in scope["headers"]):
                return m
            return None
        return None if rest.startswith("/openai/") else m

    async def __call__(self, scope, receive, send, m: re.Match) -> None:
        scope = _with_key(scope)
        params = {"rollout": m["rollout"], "agent": m["agent"]} if m["rollout"] else {}
        found = _MODEL.match(m["rest"] or "")
        method, verb = found["method"] if found else None, scope["method"]
        try:
            if m is _NOWHERE:
                raise not_served(f"{scope['method']} {scope['path']}")
            if verb == "POST" and found and method and method != "countTokens":
                query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
                adapter = _adapter(self.adapter, found["model"], method, "sse" if query.get("alt") == "sse" else "json")
                await self._model_call(scope, receive, send, adapter, params)
                return
            response = await self._other(scope, receive, verb, found, method, m, params)
        except ProxyError as err:
            response = error_response(err)
        await response(scope, receive, send)

    async def _model_call(self, scope, receive, send, adapter: Adapter, params: dict) -> None:
        try:
            await self.hot(scope, receive, send, adapter, params)
        except Exception as exc:  # noqa: BLE001 - never a traceback to the harness (as app.ProxyApp)
            log.error("internal error on POST %s", scope["path"], exc_info=exc)
            err = ProxyError(500, f"internal proxy error ({type(exc).__name__}); see the proxy's log", "server_error")
            try:
                await error_response(err)(scope, receive, send)
            except Exception:  # noqa: BLE001 - the response had already started
                pass

    async def _other(self, scope, receive, verb: str, found, method: str | None, m: re.Match,
                     params: dict) -> Response:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"authorization", b"x-api-key", b"content-length")}
        check_scope(check_auth(headers, self.api_key), identify(params, headers, self.api_key).rollout)
        if verb == "POST" and method == "countTokens":
            body = parse_json(await read_body(headers, receive, self.max_body))
            n = await count_tokens(self.route(), count_request(body, found["model"]))
            return _json({"totalTokens": n})
        if verb == "GET" and (m["rest"] or "").rstrip("/") == "/models":
            return _json({"models": [self._model(self.route().model_name)]})
        if verb == "GET" and found and not method:
            return _json(self._model(found["model"]))
        raise not_served(f"{verb} {m['rest'] or '/'}")

    @staticmethod
    def _model(name: str) -> dict:
        return {"name": f"models/{name}", "baseModelId": name, "version": "harnessrl", "displayName": name,
                "description": "the model this recording proxy serves", "supportedGenerationMethods": _METHODS}


_NOWHERE = _PATH.match("/v1beta")  # (a match of no model path: `__call__` answers it with a 404)


def _json(obj: Any) -> Response:
    return Response(orjson.dumps(obj), 200, media_type="application/json")
