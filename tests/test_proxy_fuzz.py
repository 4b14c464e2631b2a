"""Property-based fuzz of the hot path: generated chat (and some completions) requests, mostly
valid with a few mutations each (a field replaced by a value of another type or out of range, a
key dropped or added, anywhere in the body), sent through a real proxy on a socket with the
tiny model behind it, in sessions that already have earlier turns (so the prefix index compares
them). Property: no 5xx, ever; every error is OpenAI-shaped. A fixed seed (`derandomize`) keeps
CI reproducible. (The fuzz run of issue 12, 9,000 requests, once got 1,103 internal 500s.)

The second part fuzzes every route on SQLite and on PostgreSQL (see `route_calls`). Cases in CI:
300 (tiny model) + 1,500 (stand-in) + 800 × 2 (every route, per database), about two minutes on
two cores; HARNESSRL_FUZZ_SCALE=N multiplies them (N=8, 12,800 route cases: 0 × 5xx)."""

from __future__ import annotations

import copy
import json
import os
from urllib.parse import quote, urlencode

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.tiny_model import DEFAULT_TOOL

SESSIONS = ("s0", "s1", "s2")
TOOL = {"type": "function", "function": {"name": DEFAULT_TOOL, "description": "Look a word up.",
                                         "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}
USER = {"role": "user", "content": "What is the capital of france?"}

_text = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(["", "\x00", "a\x00b", "<|im_end|>"])
# stands for a list nested 300 deep (deeper than orjson writes), put in only on the wire
_DEEP = "<deep>"
_odd = st.one_of(st.none(), st.booleans(), st.just(_DEEP),
                 st.sampled_from([0, -1, 1, 2, 3, 21, 2 ** 31, 10 ** 20, -0.5, 0.5, 2.5, 1e300]),
                 _text, st.just([]), st.just({}), st.lists(st.integers(-2, 5), max_size=3),
                 st.dictionaries(st.sampled_from(["type", "text", "name", "x", "5"]), st.none() | _text | st.integers(),
                                 max_size=2))


def _message() -> st.SearchStrategy[dict]:
    call = st.fixed_dictionaries({"id": st.just("c1"), "type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.just(DEFAULT_TOOL), "arguments": st.sampled_from(['{"query": "x"}', "{}", "not json"])})})
    parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}), min_size=1, max_size=2)
    return st.one_of(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer"]), "content": _text | parts}),
        st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none() | _text},
                              optional={"tool_calls": st.lists(call, min_size=1, max_size=2)}),
        st.fixed_dictionaries({"role": st.just("tool"), "content": _text, "tool_call_id": st.just("c1")}),
    )


_chat = st.fixed_dictionaries(
    {"model": st.just("tiny"), "messages": st.lists(_message(), min_size=1, max_size=3),
     "max_tokens": st.integers(1, 2)},
    optional={"temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "seed": st.integers(0, 9),
              "stream": st.booleans(), "tools": st.just([TOOL]), "logprobs": st.booleans(),
              "tool_choice": st.sampled_from(["auto", "none", "required"]), "stop": st.just(["\n"]),
              "stream_options": st.just({"include_usage": True})})
_completion = st.fixed_dictionaries({"model": st.just("tiny"), "prompt": _text | st.lists(st.integers(0, 300), min_size=1),
                                     "max_tokens": st.integers(1, 2)}, optional={"stream": st.booleans()})


def _paths(node, at=()) -> list[tuple]:
    """Every place in a JSON tree (the root excluded)."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out.append((*at, k))
        out.extend(_paths(v, (*at, k)))
    return out


@st.composite
def requests(draw) -> tuple[str, dict, str]:
    """(endpoint, body, session): a valid body, then 0-3 mutations (0 in a fifth)."""
    chat = draw(st.integers(0, 9)) > 0
    body = draw(_chat if chat else _completion)
    session = draw(st.sampled_from(SESSIONS))
    if chat and draw(st.booleans()):  # extend the session's first turn: the prefix index compares it
        body["messages"] = [USER, FIRST_REPLY[session], *body["messages"]]
    body = copy.deepcopy(body)  # mutated below: st.just values, USER and the replies are shared objects
    for _ in range(draw(st.sampled_from([0, 1, 2, 2, 3]))):
        paths = _paths(body)
        path = draw(st.sampled_from(paths))
        parent = body
        for k in path[:-1]:
            parent = parent[k]
        how = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
        if how == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        elif how == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["role", "content", "tool_calls", "function", "name", "n", "max_tokens",
                                         "logit_bias", "presence_penalty", "top_logprobs", "x"]))] = draw(_odd)
        else:
            parent[path[-1]] = draw(_odd)
    return ("/v1/chat/completions" if chat else "/v1/completions"), body, session


FIRST_REPLY: dict[str, dict] = {}


# (backend, examples): the tiny model itself (about 40 ms a generated token on a CI core), and the
# vLLM stand-in behind the proxy's token route (prefix mode: the same validation, prefix index,
# chat template and recorder, without the model's cost) for the bulk of the examples
BACKENDS = {"local": 300, "standin": 1500 * int(os.environ.get("HARNESSRL_FUZZ_SCALE", "1"))}


@pytest.fixture(scope="module", params=list(BACKENDS))
def proxy(request, tiny_model_dir, tokenizer_dir, upstream, tmp_path_factory):
    db = str(tmp_path_factory.mktemp("fuzz") / "runs.db")
    backend = None
    if request.param == "local":
        backend = LocalBackend(tiny_model_dir, seed=0)
        cfg = ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0, default_max_tokens=2)
    else:
        cfg = ProxyConfig(db=db, upstream=upstream, prefix=True, tokenizer=str(tokenizer_dir), port=0,
                          default_max_tokens=2)
    with run_proxy(cfg, backend=backend) as p, httpx.Client(base_url=p.url, timeout=60) as http:
        for s in SESSIONS:
            r = http.post("/v1/chat/completions", json={"model": "tiny", "messages": [USER], "max_tokens": 2},
                          headers={"x-harnessrl-session": s})
            FIRST_REPLY[s] = r.json()["choices"][0]["message"]
        yield http, BACKENDS[request.param]
    if backend is not None:
        backend.close()


def test_no_request_gets_a_5xx(proxy):
    http, examples = proxy
    statuses: dict[int, int] = {}

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(requests())
    def one(req):
        path, body, session = req
        wire = json.dumps(body).replace(f'"{_DEEP}"', "[" * 300 + "]" * 300)
        r = http.post(path, content=wire, headers={"x-harnessrl-session": session,
                                                                   "content-type": "application/json"})
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, (r.status_code, r.text, body)
        if r.status_code >= 400:
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"], r.text
        elif body.get("stream") is True:  # a stream that failed after its 200 ends with an error event
            assert b'"server_error"' not in r.content, (r.text, body)

    one()
    # the generator reaches both sides: requests served and requests refused
    assert statuses.get(200, 0) > examples // 10 and statuses.get(400, 0) > examples // 10, statuses


# ---- every route, on SQLite and PostgreSQL -------------------------------------------------------
# The model surfaces (chat + completions, Anthropic messages + count_tokens, Responses over HTTP
# and the WebSocket with `previous_response_id` to a stored response of this or another rollout,
# embeddings, Gemini's generateContent / both stream forms / countTokens / an unserved method), `GET /v1/responses/{id}`, the rollout API and its metadata, /v1/models, /metrics and the
# viewer at /ui, under generated identities (path, headers, key in either header, a wrong key),
# through the vLLM stand-in in prefix mode. Property: no 5xx on any of them, every error
# OpenAI- (or Anthropic-) shaped, and the rollout list still answers at the end (a poisoned row
# once broke it for everyone). Issue 30's campaign found 29 such 5xx in 12,576 cases.
KEY = "fuzz-key"
# per database (about 15 ms each on a CI core); HARNESSRL_FUZZ_SCALE=N runs N times as many
ROUTE_EXAMPLES = 800 * int(os.environ.get("HARNESSRL_FUZZ_SCALE", "1"))
_NAN, _KNOWN = "<nan>", "<known-response>"
ATOOL = {"name": DEFAULT_TOOL, "description": "Look a word up.",
         "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}
RTOOL = {"type": "function", "name": DEFAULT_TOOL, "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}
# mostly text a surface takes (Anthropic refuses an empty text block); `_text` has "" and U+0000 too
_said = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12) | _text

_ident = st.one_of(st.sampled_from(["", "", "/r/fz1/a/ag", "/r/fz2/a/ag2"] * 2),
                   st.builds(lambda r, a: f"/r/{r}/a/{a}", _text.map(lambda t: quote(t, safe="")) | st.just("x"),
                             _text.map(lambda t: quote(t, safe="")) | st.just("y")))
_auth = st.sampled_from([{"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}] * 3
                         + [{"Authorization": f"Bearer hrl-fz1-ag:{KEY}"}, {"x-api-key": f"hrl-fz2-b:{KEY}"},
                            {"Authorization": "Bearer wrong"}, {}])
_json_value = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False)
                           | _text, lambda c: st.lists(c, max_size=3) | st.dictionaries(_text, c, max_size=3),
                           max_leaves=6)
_meta = st.one_of(st.none(), st.dictionaries(_text, _json_value, max_size=3), st.just({"x": _NAN}),
                  st.just({"big": 2 ** 64}), st.just({"deep": _DEEP}), _odd)
_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _said}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.just("tu1"), "name": st.just(DEFAULT_TOOL),
                           "input": st.just({"query": "x"})}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.just("tu1"), "content": _text}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": _text, "signature": st.just("s")}))
_messages = st.fixed_dictionaries(
    {"model": st.just("tiny"), "max_tokens": st.integers(1, 2),
     "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                                 "content": _said | st.lists(_block, min_size=1, max_size=2)}),
                          min_size=1, max_size=3)},
    optional={"system": _text, "stream": st.booleans(), "tools": st.just([ATOOL]), "temperature": st.floats(0, 1),
              "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"}]),
              "top_k": st.integers(0, 5), "stop_sequences": st.just(["\n"]), "metadata": _meta,
              "thinking": st.just({"type": "enabled", "budget_tokens": 1024})})
_item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant"]), "content": _text}),
    st.fixed_dictionaries({"type": st.just("message"), "role": st.just("user"), "content": st.lists(
        st.fixed_dictionaries({"type": st.just("input_text"), "text": _text}), min_size=1, max_size=2)}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": st.just("call_1"),
                           "name": st.just(DEFAULT_TOOL), "arguments": st.sampled_from(['{"query": "x"}', "{}", "x"])}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": st.just("call_1"), "output": _text}))
_responses = st.fixed_dictionaries(
    {"model": st.just("tiny"), "input": _said | st.lists(_item, min_size=1, max_size=3),
     "max_output_tokens": st.integers(1, 2)},
    optional={"instructions": _text, "stream": st.booleans(), "tools": st.just([RTOOL]), "store": st.booleans(),
              "previous_response_id": st.sampled_from([_KNOWN, _KNOWN, "resp_\x00", "resp_" + "0" * 32, "x"]) | _text,
              "temperature": st.floats(0, 2), "metadata": _meta, "include": st.just(["message.output_text.logprobs"]),
              "tool_choice": st.sampled_from(["auto", "none", "required"])})
GTOOL = {"functionDeclarations": [{"name": DEFAULT_TOOL, "description": "Look a word up.", "parameters": {
    "type": "OBJECT", "properties": {"query": {"type": "STRING"}}}}]}
_gpart = st.one_of(
    st.fixed_dictionaries({"text": _said}, optional={"thought": st.booleans()}),
    st.fixed_dictionaries({"functionCall": st.fixed_dictionaries(
        {"name": st.just(DEFAULT_TOOL), "args": st.just({"query": "x"})}, optional={"id": st.just("fc1")})}),
    st.fixed_dictionaries({"functionResponse": st.fixed_dictionaries(
        {"name": st.just(DEFAULT_TOOL), "response": st.just({"output": "x"}) | st.dictionaries(_text, _json_value, max_size=2)},
        optional={"id": st.just("fc1")})}))
_gemini = st.fixed_dictionaries(
    {"contents": st.lists(st.fixed_dictionaries({"parts": st.lists(_gpart, min_size=1, max_size=2)},
                                                optional={"role": st.sampled_from(["user", "model"])}),
                          min_size=1, max_size=3)},
    optional={"systemInstruction": st.just({"parts": [{"text": "Be brief."}]}), "tools": st.just([GTOOL]),
              "toolConfig": st.sampled_from([{"functionCallingConfig": {"mode": m}} for m in ("AUTO", "ANY", "NONE")]),
              "safetySettings": st.just([]),
              "generationConfig": st.fixed_dictionaries({"maxOutputTokens": st.integers(1, 2)}, optional={
                  "temperature": st.floats(0, 2), "topP": st.floats(0, 1), "topK": st.integers(0, 5),
                  "stopSequences": st.just(["\n"]), "responseMimeType": st.sampled_from(["text/plain", "application/json"]),
                  "thinkingConfig": st.just({"thinkingBudget": 0})})})
_gemini_path = st.builds(lambda m, method: f"/v1beta/models/{m}:{method}",
                         st.just("tiny") | _text.map(lambda t: quote(t, safe="") or "m"),
                         st.sampled_from(["generateContent", "generateContent", "streamGenerateContent?alt=sse",
                                          "streamGenerateContent", "countTokens", "embedContent"]))
_embeddings = st.fixed_dictionaries({"model": st.just("tiny"), "input": _said | st.lists(_said, min_size=1, max_size=2)},
                                    optional={"encoding_format": st.sampled_from(["float", "base64"])})
_rollout_id = st.sampled_from(["rw1", "rw2", "none"]) | _text.map(lambda t: quote(t, safe=""))
_rollout_api = st.one_of(
    st.tuples(st.just("POST"), st.just("/harnessrl/rollouts"), st.fixed_dictionaries(
        {}, optional={"id": _text, "task_id": _text, "group_id": _text, "run": _text, "metadata": _meta})),
    st.tuples(st.just("POST"), _rollout_id.map(lambda r: f"/harnessrl/rollouts/{r}/reward"), st.fixed_dictionaries(
        {"value": st.floats(-10, 10) | _odd}, optional={"name": _text, "metadata": _meta})),
    st.tuples(st.just("POST"), _text.map(lambda c: f"/harnessrl/calls/{quote(c, safe='') or 'c'}/reward"),
              st.fixed_dictionaries({"value": st.floats(-1, 1)}, optional={"metadata": _meta})),
    st.tuples(st.just("POST"), st.sampled_from(["rw2", "zz"]).map(lambda r: f"/harnessrl/rollouts/{r}/finish"),
              st.fixed_dictionaries({}, optional={"error": _text})),
    st.tuples(st.just("GET"), st.builds(lambda k, v: f"/harnessrl/rollouts?{urlencode({k: v})}",
                                        st.sampled_from(["task_id", "group_id", "run", "x"]), _text), st.none()),
    st.tuples(st.just("GET"), _rollout_id.map(lambda r: f"/harnessrl/rollouts/{r}"), st.none()),
    st.tuples(st.just("GET"), st.sampled_from(["/v1/models", "/metrics", "/harnessrl/rollouts", "/v1beta/models",
                                               "/v1beta/models/tiny", "/v1beta/files"]), st.none()),
    st.tuples(st.just("GET"), st.builds(lambda p, k, v: f"/ui/{p}?{urlencode({k: v})}",
                                        st.sampled_from(["", "api/rollouts", "api/groups/g"]),
                                        st.sampled_from(["task", "group", "run", "status", "reward_min", "page"]),
                                        _text), st.none()),
    st.tuples(st.just("GET"), st.builds(lambda p, i: f"/ui/{p}/{quote(i, safe='') or 'i'}",
                                        st.sampled_from(["rollouts", "api/rollouts", "groups"]), _text), st.none()),
)


@st.composite
def route_calls(draw) -> tuple[str, str, dict | None, dict, str]:
    """(method, path, body, headers, kind): kind is "ws" for a Responses WebSocket turn."""
    headers = {**draw(_auth), "x-harnessrl-session": draw(st.sampled_from(["s0", "s1", "s0", "s1", "", "bad id"]))}
    kind = draw(st.sampled_from(["chat", "messages", "messages", "responses", "responses", "ws", "count", "embeddings",
                                 "get-response", "get-response", "rollouts", "rollouts", "rollouts", "gemini",
                                 "gemini"]))
    if kind == "rollouts":
        method, path, body = draw(_rollout_api)
    elif kind == "gemini":  # the Gemini key header, for the x-api-key the others send
        method, body = "POST", copy.deepcopy(draw(_gemini))
        path = draw(_ident) + draw(_gemini_path)
        headers = {("x-goog-api-key" if k == "x-api-key" else k): v for k, v in headers.items()}
    elif kind == "get-response":
        method, body = "GET", None
        path = draw(_ident) + "/v1/responses/" + draw(st.just(_KNOWN) | _text.map(lambda t: quote(t, safe="") or "r"))
    else:
        method = "POST"
        strategy = {"chat": _chat, "messages": _messages, "count": _messages, "embeddings": _embeddings}.get(
            kind, _responses)
        path = draw(_ident) + {"chat": "/v1/chat/completions", "messages": "/v1/messages", "embeddings": "/v1/embeddings",
                               "count": "/v1/messages/count_tokens"}.get(kind, "/v1/responses")
        body = copy.deepcopy(draw(strategy))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        if not body:
            break
        node_path = draw(st.sampled_from(_paths(body)))
        parent = body
        for k in node_path[:-1]:
            parent = parent[k]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[node_path[-1]]
        else:
            parent[node_path[-1]] = draw(_odd)
    return method, path, body, headers, kind


def _wire(body: dict, known: str) -> str:
    return (json.dumps(body).replace(f'"{_DEEP}"', "[" * 300 + "]" * 300).replace(f'"{_NAN}"', "NaN")
            .replace(_KNOWN, known))


def _shaped(r: httpx.Response) -> None:
    """An OpenAI error body, Anthropic's on /messages, Gemini's on /v1beta, the viewer's on /ui."""
    err = r.json()["error"]
    if "/v1beta/" in r.url.path:
        assert set(err) <= {"code", "message", "status", "details"} and err["message"] and err["status"], r.text
        assert err["code"] == r.status_code, r.text
        return
    assert isinstance(err, dict) and err.get("message") and err.get("type"), r.text
    if "/messages" not in r.url.path and "/ui/" not in r.url.path:
        assert set(err) == {"message", "type", "param", "code"}, r.text


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def every_route(request, tokenizer_dir, upstream, tmp_path):
    from harnessrl.viewer.app import create_viewer

    db = str(tmp_path / "runs.db") if request.param == "sqlite" \
        else request.getfixturevalue("pg_url")
    cfg = ProxyConfig(db=db, upstream=upstream, prefix=True, tokenizer=str(tokenizer_dir), port=0,
                      default_max_tokens=2, api_key=KEY)
    with run_proxy(cfg) as p, httpx.Client(base_url=p.url, timeout=60) as http:
        p.app.mount("/ui", create_viewer(db, api_key=KEY))
        made = http.post("/r/fz1/a/ag/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 2},
                         headers={"Authorization": f"Bearer {KEY}"})
        assert made.status_code == 200, made.text
        yield p, http, made.json()["id"]


def _ws_turn(url: str, headers: dict, wire: str) -> list[dict]:
    """The events one `response.create` gets (or the refused handshake's status as an error)."""
    try:
        with connect(url, additional_headers=headers, open_timeout=30) as ws:
            ws.send(wire)
            events = []
            while True:
                events.append(json.loads(ws.recv(timeout=60)))
                if events[-1]["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
                    return events
    except InvalidStatus as refused:
        return [{"type": "error", "status": refused.response.status_code}]


def test_no_route_gets_a_5xx_on_either_database(every_route):
    p, http, known = every_route
    statuses: dict[str, int] = {}

    @settings(max_examples=ROUTE_EXAMPLES, derandomize=True, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(route_calls())
    def one(call):
        method, path, body, headers, kind = call
        headers = {k: v for k, v in headers.items() if v}
        if kind == "ws":
            wire = _wire({"type": "response.create", **(body or {})}, known)
            events = _ws_turn(p.url.replace("http://", "ws://") + path, headers, wire)
            worst = max([e.get("status", 200) for e in events if e["type"] == "error"] or [200])
            assert worst < 500 and not any(e["type"] == "response.failed" for e in events), (events, body)
            statuses[f"ws {worst}"] = statuses.get(f"ws {worst}", 0) + 1
            return
        r = http.request(method, path.replace(_KNOWN, known), headers={**headers, "content-type": "application/json"},
                         content=_wire(body, known) if body is not None else None)
        statuses[f"{kind} {r.status_code}"] = statuses.get(f"{kind} {r.status_code}", 0) + 1
        assert r.status_code < 500 or (kind == "count" and r.status_code == 501), (r.status_code, r.text, path, body)
        if r.status_code >= 400 and r.headers.get("content-type", "").startswith("application/json"):
            _shaped(r)
        elif kind == "gemini" and "stream" in path:  # a stream that failed after its 200 ends with an error
            assert b'"status":"INTERNAL"' not in r.content, (r.text, body)
        elif (body or {}).get("stream") is True:
            assert b'"server_error"' not in r.content and b"response.failed" not in r.content, (r.text, body)

    one()
    listed = http.get("/harnessrl/rollouts", headers={"x-api-key": KEY})
    assert listed.status_code == 200, listed.text
    for ro in listed.json()["data"]:
        assert http.get(f"/harnessrl/rollouts/{ro['id']}", headers={"x-api-key": KEY}).status_code == 200
    print(sorted(statuses.items()))
    # every kind of call reaches both sides: served and refused
    for kind in ("chat", "messages", "responses", "embeddings", "count", "rollouts", "get-response", "gemini"):
        assert any(k.startswith(f"{kind} 2") for k in statuses), statuses
        assert any(k.startswith(f"{kind} 4") for k in statuses), statuses
    assert statuses.get("ws 200") and any(k.startswith("ws 4") for k in statuses), statuses
