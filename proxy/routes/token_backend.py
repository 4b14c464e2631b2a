"""What the proxy needs from a model backend that works on token ids (the embedded local
backend; a vLLM upstream in prefix-consistent mode speaks the same through /v1/completions).

The proxy owns the OpenAI wire format; a backend only turns prompt token ids into completion
token ids with their sampling log-probs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None  # None: the backend's own seeded generator
    stop: list[str] = field(default_factory=list)
    top_logprobs: int = 0  # alternatives to report per token
    constraint: Any = None  # local backend: a `local.constrained.Constraint` that masks each token's logits
    upstream_fields: dict = field(default_factory=dict)  # upstream: fields it enforces itself (response_format)
    via: Any = None  # several upstreams: the session's lease to send through (else the backend's pool)


@dataclass
class TokenDelta:
    """One generated token, as streamed."""

    token_id: int
    logprob: float  # log-prob of the sampled token under the processed (temperature/top-p) distribution
    text: str  # decoded text added by this token ("" while a multi-byte character is incomplete)
    top: list[tuple[str, float]] | None = None  # the top-k alternatives (text, log-prob), when asked for


@dataclass
class Completion:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # one per completion token
    text: str  # decode(completion_ids), special tokens other than EOS kept (<think>, <tool_call>)
    finish_reason: str  # "stop" | "length"
    weight_version: str
    top_logprobs: list[list[tuple[str, float]]] | None = None  # per token, when asked for


class TokenBackend(Protocol):
    model_name: str

    @property
    def weight_version(self) -> str: ...

    @property
    def tokenizer(self) -> Any: ...

    def render(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True) -> list[int]:
        """Chat-template token ids for `messages` (+ tool schemas)."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion: ...

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenDelta | Completion]:
        """Yields a TokenDelta per generated token, then the final Completion."""

    def reload(self, checkpoint_dir: str, version: str | None = None) -> str:
        """Load new weights from a checkpoint directory while serving; returns the new weight version."""
