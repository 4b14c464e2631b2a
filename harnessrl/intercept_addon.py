"""The mitmproxy addon of `harnessrl intercept`: LLM API calls go to the recording proxy.

Loaded by mitmdump (`-s` this file) in mitmproxy's own environment, so it imports nothing from
harnessrl: only the standard library and mitmproxy (tests/test_intercept_addon.py checks that).

- A request to a known LLM API host (api.openai.com, api.anthropic.com, *.openai.azure.com,
  openrouter.ai, generativelanguage.googleapis.com, and the `hrl_hosts` patterns) is rewritten
  to the proxy's matching endpoint (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`,
  `/v1/messages`, `/v1/embeddings`, `/v1/models`, and the Gemini API's
  `/v1beta/models[/{model}[:{method}]]`); any other path on such a host is answered 404 here,
  never sent on with the client's key.
- Identity: an `hrl-…` key sent by the client is passed on as is; else the username of the
  proxy credentials (`HTTPS_PROXY=http://hrl-<rollout>-<agent>:x@host:port`, which lets one
  mitmdump serve many rollouts); else the `hrl_rollout`/`hrl_agent` options, as X-HarnessRL-*
  headers. The client's real credentials (headers, and the query string: all of it on the
  OpenAI-style paths, Gemini's `key` on its paths, whose `alt=sse` picks the stream's format)
  are dropped.
- Other hosts pass through untouched (TLS not even opened, so pinning clients keep working), or
  with `hrl_only_llm` are refused with a 403.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
import os
import re
from urllib.parse import unquote, urlsplit

from mitmproxy import ctx, http, tls

KNOWN_HOSTS = ("api.openai.com", "api.anthropic.com", "*.openai.azure.com", "openrouter.ai",
               "generativelanguage.googleapis.com")
ENDPOINTS = ("chat/completions", "completions", "responses", "messages", "embeddings", "models")
# the endpoint at the end of any vendor's path: /v1/…, /api/v1/… (OpenRouter), /openai/v1/… and
# /openai/deployments/<name>/… (Azure); sub-paths (/v1/messages/count_tokens) are kept
_ENDPOINT = re.compile(r"/(?:deployments/(?P<deployment>[^/]+)/)?(?P<endpoint>" + "|".join(ENDPOINTS) + r")(?P<rest>/.*)?$")
# the Gemini API, looked for first (its paths hold `/models`): v1beta (what its SDKs call) or
# v1alpha, and v1 for a model's method (on OpenAI's v1, /models/{id} is a model's page); all
# served by the proxy's v1beta surface. Its other paths (files, cachedContents) are no endpoint.
_GEMINI = re.compile(r"/(?:v1beta|v1alpha)/models(?P<rest>/[^/]+)?$|/v1/models(?P<method>/[^/:]+:[A-Za-z]+)$")
# credentials a client may send; none of them reaches the recording proxy
_SECRET_HEADERS = ("authorization", "x-api-key", "api-key", "x-goog-api-key", "proxy-authorization", "cookie")
_SECRET_PARAMS = ("key", "api_key", "api-key")
_IDENTITY_HEADERS = ("x-harnessrl-rollout", "x-harnessrl-agent")


def _error(status: int, message: str, code: str) -> http.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return http.Response.make(status, json.dumps(body), {"content-type": "application/json"})


def _hrl_key(headers) -> str | None:
    for name in ("authorization", "x-api-key", "api-key", "x-goog-api-key"):
        value = headers.get(name, "")
        token = value.split(" ", 1)[1].strip() if value.lower().startswith("bearer ") else value.strip()
        if token.startswith("hrl-"):
            return token
    return None


def _proxy_user(headers) -> str | None:
    """The username of `Proxy-Authorization: Basic …` when it is an `hrl-` identity."""
    scheme, _, value = headers.get("proxy-authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        # `user:password`, where the user may itself hold a ":" (a rollout's key `hrl-…:rk_…`)
        # and the password ("x") does not; a client that did not decode %3A in the URL sends it as is
        user = unquote(base64.b64decode(value.strip(), validate=True).decode().rpartition(":")[0])
    except (binascii.Error, UnicodeDecodeError):
        return None
    return user if user.startswith("hrl-") else None


class Intercept:
    def __init__(self) -> None:
        self.patterns: tuple[str, ...] = KNOWN_HOSTS
        self.target = urlsplit("http://127.0.0.1:8000")
        self.proxy_key = ""
        self.identities: dict[str, str] = {}  # client connection id -> hrl- identity from CONNECT

    def load(self, loader) -> None:
        loader.add_option("hrl_proxy", str, "http://127.0.0.1:8000", "The harnessrl recording proxy.")
        loader.add_option("hrl_rollout", str, "", "Rollout of calls that carry no identity.")
        loader.add_option("hrl_agent", str, "", "Agent of calls that carry no identity.")
        loader.add_option("hrl_hosts", str, "", "More LLM API hosts (comma-separated, * patterns).")
        loader.add_option("hrl_only_llm", bool, False, "Refuse (403) everything that is not an LLM API call.")

    def configure(self, updated) -> None:
        extra = tuple(h.strip().lower() for h in ctx.options.hrl_hosts.split(",") if h.strip())
        self.patterns = KNOWN_HOSTS + extra
        self.target = urlsplit(ctx.options.hrl_proxy.rstrip("/"))
        # the recording proxy's --api-key comes from the environment: a command line is public (ps)
        self.proxy_key = os.environ.get("HARNESSRL_PROXY_API_KEY", "")

    def is_llm(self, host: str | None) -> bool:
        host = (host or "").lower().rstrip(".")
        return any(fnmatch.fnmatchcase(host, p) for p in self.patterns)

    def is_proxy(self, host: str, port: int) -> bool:
        return host == self.target.hostname and port == (self.target.port or 80)

    def http_connect(self, flow: http.HTTPFlow) -> None:
        user = _proxy_user(flow.request.headers)
        if user:
            self.identities[flow.client_conn.id] = user
        if ctx.options.hrl_only_llm and not self.is_llm(flow.request.host):
            flow.response = _refused(flow.request.host)

    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        server = data.context.server.address
        host = data.client_hello.sni or (server[0] if server else None)
        if not self.is_llm(host):
            data.ignore_connection = True  # not ours: the client talks TLS to the real server

    def client_disconnected(self, client) -> None:
        self.identities.pop(client.id, None)

    def request(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        if not self.is_llm(req.pretty_host):
            if ctx.options.hrl_only_llm and not self.is_proxy(req.host, req.port):
                flow.response = _refused(req.pretty_host)
            return
        path = req.path.split("?", 1)[0]
        gemini = _GEMINI.search(path)
        m = None if gemini else _ENDPOINT.search(path)
        if m is None and gemini is None:
            flow.response = _error(404, f"harnessrl intercept: {req.method} {req.path.split('?', 1)[0]} on "
                                        f"{req.pretty_host} is not an endpoint the recording proxy serves",
                                   "not_recorded")
            return
        identity = _hrl_key(req.headers) or _proxy_user(req.headers) or self.identities.get(flow.client_conn.id)
        for name in _SECRET_HEADERS + _IDENTITY_HEADERS:
            req.headers.pop(name, None)
        if identity:
            # the operator's key completes a bare identity (`harnessrl intercept`); a rollout's own key
            # (`hrl-…`, what `run` gives) is only the default of calls that carry none
            operator = self.proxy_key and not self.proxy_key.startswith("hrl-")
            key = f"{identity}:{self.proxy_key}" if operator and ":" not in identity else identity
            req.headers["authorization"] = f"Bearer {key}"
        else:
            if ctx.options.hrl_rollout:
                req.headers["x-harnessrl-rollout"] = ctx.options.hrl_rollout
            if ctx.options.hrl_agent:
                req.headers["x-harnessrl-agent"] = ctx.options.hrl_agent
            if self.proxy_key:
                req.headers["authorization"] = f"Bearer {self.proxy_key}"
        base = f"{self.target.scheme}://{self.target.netloc}{self.target.path.rstrip('/')}"
        if gemini:
            query = [(k, v) for k, v in req.query.items(multi=True) if k.lower() not in _SECRET_PARAMS]
            req.url = f"{base}/v1beta/models{gemini['rest'] or gemini['method'] or ''}"
            req.query = query
            return
        if m["deployment"] and req.method == "POST":
            _default_model(req, m["deployment"])  # Azure names the model in the path, not the body
        req.url = f"{base}/v1/{m['endpoint']}{m['rest'] or ''}"

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if "text/event-stream" in flow.response.headers.get("content-type", ""):
            flow.response.stream = True  # tokens reach the client as they come


def _default_model(req: http.Request, deployment: str) -> None:
    try:
        body = json.loads(req.get_content() or b"{}")
    except ValueError:
        return  # the proxy answers a malformed body with its own 400
    if isinstance(body, dict) and "model" not in body:
        body["model"] = deployment
        req.set_content(json.dumps(body).encode())


def _refused(host: str) -> http.Response:
    return http.Response.make(
        403, f"harnessrl intercept --only-llm: {host} is not an LLM API host; the request was not sent\n",
        {"content-type": "text/plain"})


addons = [Intercept()]
