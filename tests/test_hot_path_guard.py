"""The hot path's per-call work, counted (issue 45): what is built once must not be built per call,
and what a call needs once must not be done twice between its surface and its record.

No timing is asserted. A real proxy (pass-through to the vLLM stand-in, and `--prefix`, where the
proxy renders prompts itself) serves every surface — Chat Completions (plain and streamed),
Completions, Responses, Anthropic Messages, Gemini — while a profile hook on the proxy's
event-loop thread counts calls of the functions below. Each surface is warmed by a few calls
(caches filled, connections open), then served `CALLS` more, and per call:

- nothing is compiled or built: no regular expression compiled, no Jinja template compiled, no
  `Volatile` / `Rewrites` rule set, no pydantic `TypeAdapter`, no dataclass made, no anyio task
  group made (a stream's hang-up is watched by one plain task);
- nothing is fingerprinted again: the agent name of a system prompt seen before is cached (no
  volatile masking, no SHA-256);
- a body is checked once (one `check_chat` / `check_completion`), parsed once, and JSON is encoded
  no more often than the call's own budget (the upstream's body, the answer, the record's request
  and response: `ENCODES`), decoded no more often than `DECODES`; a prompt is rendered at most once.

A feature that adds such work to every call fails here, naming the count that grew.
"""

from __future__ import annotations

import re
import sys
import threading
from collections import Counter
from contextlib import contextmanager

import anyio
import httpx
import jinja2
import orjson
import pytest

from harnessrl.proxy.prefix.rewrites import Rewrites
from harnessrl.proxy.prefix.volatile import Volatile
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.proxy.validate import check_chat, check_completion

WARM, CALLS = 3, 4
SYSTEM = "You are a terse assistant. Answer in one line."
QUESTION = "What is the capital of the river country?"

# Python functions that must not run on a warmed hot path at all
NEVER = {
    "regex compiled": re._compiler.compile,  # type: ignore[attr-defined]  # re.compile's cache misses
    "Jinja template compiled": jinja2.Environment.compile,
    "volatile-span rules built": Volatile.__init__,
    "rewrite rules built": Rewrites.__init__,
    "system prompt masked (agent fingerprint not cached)": Volatile.mask,
    # Starlette's StreamingResponse watches for a hang-up in one, ~15 % of a streamed call's CPU
    "anyio task group made": anyio.create_task_group,
}
try:
    from pydantic import TypeAdapter

    NEVER["pydantic TypeAdapter built"] = TypeAdapter.__init__
except ImportError:  # pragma: no cover - pydantic comes with FastAPI
    pass
# C functions that must not run on a warmed hot path at all
NEVER_C = {"SHA-256 (agent fingerprint not cached)": __import__("hashlib").sha256}
# counted per call against a budget
PER_CALL = {"body checked (check_chat)": check_chat, "body checked (check_completion)": check_completion,
            "prompt rendered (Jinja)": jinja2.Template.render}
PER_CALL_C = {"JSON encoded": orjson.dumps, "JSON decoded": orjson.loads}

# (surface, path, body) served by every proxy
SURFACES = (
    ("chat", "/v1/chat/completions", {"model": "m", "max_tokens": 8, "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]}),
    ("chat stream", "/v1/chat/completions", {"model": "m", "max_tokens": 8, "stream": True, "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]}),
    ("completions", "/v1/completions", {"model": "m", "max_tokens": 8, "prompt": QUESTION}),
    ("responses", "/v1/responses", {"model": "m", "max_output_tokens": 16, "instructions": SYSTEM,
                                    "input": QUESTION}),
    ("messages", "/v1/messages", {"model": "m", "max_tokens": 8, "system": SYSTEM,
                                  "messages": [{"role": "user", "content": QUESTION}]}),
    ("gemini", "/v1beta/models/m:generateContent", {
        "systemInstruction": {"parts": [{"text": SYSTEM}]},
        "contents": [{"role": "user", "parts": [{"text": QUESTION}]}],
        "generationConfig": {"maxOutputTokens": 8}}),
)
# JSON encodes a call may make: the upstream's body, the answer, the record's request; the record's
# response is the answer's own encoding (it keeps all of it: no token ids were asked for)
ENCODES = {"chat": 3, "completions": 3, "responses": 3, "messages": 3, "gemini": 3}
# decodes: the request body and the upstream's answer
DECODES = {"chat": 2, "completions": 2, "responses": 2, "messages": 2, "gemini": 2}


class _Counts:
    """A profile hook for the proxy's event-loop thread: counts calls of the watched functions
    while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.counts: Counter[str] = Counter()
        self._codes = {f.__code__: name for name, f in {**NEVER, **PER_CALL}.items()}
        self._builtins = {id(f): name for name, f in {**NEVER_C, **PER_CALL_C}.items()}

    def hook(self, frame, event, arg):
        if not self.on:
            return
        if event == "call":
            name = self._codes.get(frame.f_code)
            if name is not None:
                self.counts[name] += 1
        elif event == "c_call":
            name = self._builtins.get(id(arg))
            if name is not None:
                self.counts[name] += 1


# the proxy's threads that serve a call: its event loop, and the token route's prompt renderers
_PROXY_THREADS = ("harnessrl-proxy", "harnessrl-prompt")


@contextmanager
def _counted_proxy(cfg: ProxyConfig):
    """The proxy, with its threads that serve calls under the counting hook."""
    counts = _Counts()

    def hook(frame, event, arg):  # each new thread's first event: keep counting it, or stop profiling
        sys.setprofile(counts.hook if threading.current_thread().name.startswith(_PROXY_THREADS) else None)

    threading.setprofile(hook)  # threads started from here on (the prompt pool starts on the first call)
    try:
        with run_proxy(cfg) as proxy:
            yield proxy, counts
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]


def _serve(client: httpx.Client, base: str, path: str, body: dict, n: int) -> None:
    for _ in range(n):
        r = client.post(base + path, json=body)
        assert r.status_code == 200, r.text


@pytest.fixture(scope="module", params=["pass-through", "prefix"])
def proxy(request, upstream, tokenizer_dir, tmp_path_factory):
    extra = {"prefix": True, "tokenizer": str(tokenizer_dir)} if request.param == "prefix" else {}
    cfg = ProxyConfig(upstreams=(upstream,), db=str(tmp_path_factory.mktemp("guard") / "runs.db"), port=0,
                      **extra)
    with _counted_proxy(cfg) as running:
        yield request.param, *running


@pytest.mark.parametrize("surface,path,body", SURFACES, ids=[s[0] for s in SURFACES])
def test_no_per_call_rebuilds(proxy, surface, path, body):
    mode, running, counts = proxy
    with httpx.Client(timeout=30) as client:
        _serve(client, running.url, path, body, WARM)
        counts.counts.clear()
        counts.on = True
        try:
            _serve(client, running.url, path, body, CALLS)
        finally:
            counts.on = False
    seen = dict(counts.counts)
    for name in [*NEVER, *NEVER_C]:
        assert seen.get(name, 0) == 0, f"{mode} {surface}: {name} on the hot path ({seen.get(name)} in {CALLS} calls)"
    checks = seen.get("body checked (check_chat)", 0) + seen.get("body checked (check_completion)", 0)
    assert checks <= CALLS, f"{mode} {surface}: the body was checked {checks} times in {CALLS} calls"
    renders = seen.get("prompt rendered (Jinja)", 0)
    assert renders <= (CALLS if mode == "prefix" else 0), f"{mode} {surface}: {renders} renders in {CALLS} calls"
    kind = surface.split()[0]
    if surface.endswith("stream"):
        return  # a stream encodes and decodes per chunk: its counts follow the answer's length
    encodes, decodes = seen.get("JSON encoded", 0), seen.get("JSON decoded", 0)
    assert encodes <= ENCODES[kind] * CALLS, f"{mode} {surface}: {encodes / CALLS:g} JSON encodes a call"
    assert decodes <= DECODES[kind] * CALLS, f"{mode} {surface}: {decodes / CALLS:g} JSON decodes a call"
