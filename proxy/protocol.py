"""The proxy's internal call model: what an API adapter hands a route and gets back.

A call is an OpenAI Chat Completions request (or a legacy Completions one) — the shape every
other API surface (Responses, Anthropic Messages) can be translated to and from, and the shape
the records hold. A `Route` turns a `Request` into a `Result` (or, streaming, into batches of
`Delta`s followed by the `Result`); it knows nothing about the wire format the harness speaks.
An adapter renders deltas and results in its own wire format (`surfaces.openai_chat` for OpenAI).
"""

from __future__ import annotations

from array import array
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol

from harnessrl.proxy.prefix.prompts import Turn


@dataclass(slots=True)
class Request:
    """One model call. `body` is an OpenAI Chat Completions body (`chat`) or a Completions one:
    what the records store and what a pass-through route forwards."""

    body: dict[str, Any]
    chat: bool = True
    # another API surface's own request ({api, body, headers}): recorded beside the chat body
    # (under "harnessrl_surface"), never forwarded
    surface: dict[str, Any] | None = None
    # several upstreams: the session's `upstream.ring.Lease` (Pool's request/stream) the route forwards
    # with; None: the route's own pool
    upstream: Any = None
    # recorded beside the body, never forwarded ("harnessrl_upstream", "harnessrl_sampling")
    notes: dict[str, Any] | None = None
    # the API surface the call came in through (`Adapter.surface`, recorded as `calls.surface`;
    # None: the endpoint's name) and the harness's User-Agent (`calls.client`)
    via: str | None = None
    client: str | None = None

    @property
    def endpoint(self) -> str:
        return "chat" if self.chat else "completions"

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def messages(self) -> list[dict]:
        return self.body["messages"]

    @property
    def tools(self) -> list[dict] | None:
        """The tools the model is shown: none under `tool_choice: "none"` (hidden, as OpenAI does)."""
        return None if self.body.get("tool_choice") == "none" else self.body.get("tools")

    @property
    def n(self) -> int:
        """How many choices the harness gets back (each sample is its own call record)."""
        return int(self.body.get("n") or 1)

    @property
    def best_of(self) -> int:
        """How many samples to draw (Completions `best_of`; the n most likely are returned)."""
        return max(int(self.body.get("best_of") or 1), self.n) if not self.chat else self.n

    @property
    def top_logprobs(self) -> int:
        """How many alternatives per token the harness asked for (0: none)."""
        k = self.body.get("top_logprobs") if self.chat else self.body.get("logprobs")
        return int(k or 0) if self.logprobs else 0

    @property
    def token_ids(self) -> bool:
        """Whether the harness asked for token ids back (vLLM's `return_token_ids`)."""
        return bool(self.body.get("return_token_ids"))

    @property
    def logprobs(self) -> bool:
        """Whether the harness asked for per-token log-probs back."""
        lp = self.body.get("logprobs")
        return bool(lp) if self.chat else lp is not None

    @property
    def include_usage(self) -> bool:
        opts = self.body.get("stream_options")
        return bool(isinstance(opts, dict) and opts.get("include_usage"))


@dataclass(slots=True)
class Progress:
    """What a stream has generated so far, kept up to date by the route: a stream the harness
    abandons is recorded with it (status "cancelled")."""

    prompt_ids: list[int] | None = None
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)  # pieces of the completion text


@dataclass(slots=True)
class Prompt:
    """How a route builds the prompt, known before the model runs (recorded even when it fails)."""

    path: str  # "prefix" (an earlier call's exact ids + rendered suffix) | "render" | "raw"
    prefix_call_id: str | None = None
    drift: bool | None = None
    ids: list[int] | None = None  # token routes: the prompt ids
    turn: Turn | None = None  # the earlier call this one extends
    progress: Progress = field(default_factory=Progress)  # streams: filled as tokens arrive


@dataclass(slots=True)
class Delta:
    """A piece of a streamed answer (of choice `index`)."""

    role: str | None = None
    content: str | None = None  # chat: content text; completions: text
    reasoning: str | None = None
    tool_calls: list[dict] | None = None  # OpenAI streamed tool-call pieces ({index, id, type, function})
    logprobs: list[tuple[str, float]] | None = None  # (token text, log-prob), when the harness asked
    top_logprobs: list[list[tuple[str, float]]] | None = None  # per token: its top-k (text, log-prob)
    token_ids: list[int] | None = None  # this piece's token ids, when the harness asked (`return_token_ids`)
    prompt_ids: list[int] | None = None  # on a stream's first delta, when the harness asked for token ids
    finish_reason: str | None = None
    usage: dict | None = None
    terminal: bool = False  # held back (with all that follows) until the call is recorded
    raw: dict | None = None  # the upstream's own OpenAI chunk, stripped: OpenAI adapters send it as is
    index: int = 0  # the choice (n > 1)


@dataclass(slots=True)
class Result:
    """A finished call: what the records need and what every adapter renders."""

    text: str | None  # chat: the message content; completions: the text
    finish_reason: str | None
    usage: dict | None  # {prompt_tokens, completion_tokens, total_tokens}
    message: dict | None = None  # chat: the assistant message (content, tool_calls, reasoning)
    prompt_ids: list[int] | array | None = None  # an upstream's, once checked: an int32 array
    completion_ids: list[int] | array | None = None
    logprobs: list[float] | None = None
    weight_version: str | None = None
    tokens: list[str] | None = None  # per completion token text, when the harness asked for log-probs
    top_logprobs: list[list[tuple[str, float]]] | None = None  # per completion token: top-k (text, log-prob)
    drift: bool | None = None  # set when only the answer tells (an upstream's own rendering)
    raw: dict | None = None  # the upstream's own OpenAI body, stripped: OpenAI adapters send it as is

    @property
    def tool_calls(self) -> list | None:
        return (self.message or {}).get("tool_calls") or None


def usage(n_prompt: int, n_completion: int) -> dict:
    return {"prompt_tokens": n_prompt, "completion_tokens": n_completion, "total_tokens": n_prompt + n_completion}


class Route(Protocol):
    """A way to a model: pass-through to an upstream, or a token route over a `TokenBackend`."""

    model_name: str
    eos_ids: frozenset[int]  # ids that end an assistant turn (empty when the route has no tokenizer)

    async def prompt(self, req: Request, turn: Turn | None) -> Prompt:
        """How the prompt will be built; raises for a request the route cannot serve. A route
        that renders or tokenizes does it off the event loop (a large body takes seconds)."""

    async def run(self, req: Request, prompt: Prompt) -> Result: ...

    def stream(self, req: Request, prompt: Prompt) -> AsyncGenerator[list[Delta] | Result, None]:
        """Batches of deltas (each batch: what arrived together, sent in one write), then the
        Result. The first item comes only once the model has started answering, so an error
        before it still reaches the harness as an HTTP status."""
