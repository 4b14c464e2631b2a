"""The records schema (docs/methods.md §1): tasks, rollouts, calls, rewards, expert traces, weight versions.

Token ids and log-probs are stored as little-endian int32 / float32 byte arrays
(`pack_ids`, `pack_logprobs`), not JSON text: a 4k-token prompt is 16 KB, not 25 KB of
digits, and decoding is one `np.frombuffer`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import re

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

UNASSIGNED_ROLLOUT = "unassigned"

# PostgreSQL text cannot hold U+0000, which a model may well generate. Text columns that hold
# model output store it escaped, on every database alike: U+0000 as U+FFFF "0" and U+FFFF
# itself as U+FFFF U+FFFF (a noncharacter, reserved for uses like this one, so text without
# U+0000 is stored as is). JSON columns need nothing: their U+0000 is the escape "\u0000".
_ESC = "\uffff"
_ESCAPED = re.compile(_ESC + "(.)", re.S)


def escape_nul(text: str | None) -> str | None:
    if text is None or ("\0" not in text and _ESC not in text):
        return text
    return text.replace(_ESC, _ESC + _ESC).replace("\0", _ESC + "0")


def unescape_nul(text: str | None) -> str | None:
    if text is None or _ESC not in text:
        return text
    return _ESCAPED.sub(lambda m: "\0" if m[1] == "0" else m[1], text)


class NulSafeText(TypeDecorator):
    """Text that may hold U+0000 (escaped on the way in, restored on the way out)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return escape_nul(value)

    def process_result_value(self, value, dialect):
        return unescape_nul(value)


TEXT_ONLY = "text-only"  # Call.prompt_path of a call from a provider that returns no token ids


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Task(Base):
    __tablename__ = "tasks"
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    input: Mapped[Any] = mapped_column(JSON)  # text or a list of chat messages
    reference: Mapped[Any | None] = mapped_column(JSON, nullable=True)  # reference answer
    reference_calls: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)  # [{name, arguments}]
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class ExpertTrace(Base):
    __tablename__ = "expert_traces"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    messages: Mapped[list[Any]] = mapped_column(JSON)  # OpenAI-style chat messages of the expert
    source: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class Rollout(Base):
    __tablename__ = "rollouts"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    group_id: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    run: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)  # e.g. a loop round
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # status and created_at are indexed: the trace viewer filters and sorts 100k rollouts on them
    status: Mapped[str] = mapped_column(String(16), default="running", index=True)  # running | finished | failed (does not count: compile leaves it out)
    next_seq: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # calls answered with an error while the rollout ran (its `error` call rows, counted in the
    # transaction that writes them): compile leaves such rollouts out of their groups, and the
    # viewer filters on it without reading calls. Indexed: almost every value is 0.
    errors: Mapped[int] = mapped_column(Integer, default=0, server_default="0", index=True)


class Call(Base):
    __tablename__ = "calls"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollouts.id"))
    seq: Mapped[int] = mapped_column(Integer)
    session_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    agent: Mapped[str | None] = mapped_column(String(128), nullable=True)
    parent_call_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    endpoint: Mapped[str] = mapped_column(String(32))  # chat | completions | embeddings
    # the API surface the call came in through: chat | completions | embeddings | responses |
    # messages | responses-ws (NULL: recorded before the column existed, and not backfilled)
    surface: Mapped[str | None] = mapped_column(String(16), nullable=True)
    client: Mapped[str | None] = mapped_column(String(128), nullable=True)  # the harness's User-Agent, cut to 128
    model: Mapped[str | None] = mapped_column(String(256), nullable=True)
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    # request: messages / prompt, tools, tool_choice, sampling params (never auth)
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    # response: the response body the harness got (for streams: the reassembled one), less the
    # token-id fields of `return_token_ids` (`prompt_token_ids`, `choices[].token_ids`): the id
    # columns below hold them
    response: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    response_text: Mapped[str | None] = mapped_column(NulSafeText, nullable=True)
    tool_calls: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    finish_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    prompt_ids: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    completion_ids: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    completion_logprobs: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    # how the prompt was built: "prefix" (earlier call's exact ids + rendered suffix),
    # "render" (chat template / upstream rendering), "raw" (completions prompt), or TEXT_ONLY
    # (an upstream that returns no token ids or log-probs: text only, never an RL sample)
    prompt_path: Mapped[str | None] = mapped_column(String(16), nullable=True)
    prefix_call_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    drift: Mapped[bool | None] = mapped_column(Boolean, nullable=True)  # rendered prefix != sampled ids
    weight_version: Mapped[str | None] = mapped_column(String(128), nullable=True)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    completion_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="ok")  # ok | error | cancelled (stream abandoned) | discarded (best_of)
    error: Mapped[str | None] = mapped_column(NulSafeText, nullable=True)  # may quote model or upstream text
    created_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        Index("ix_calls_rollout_seq", "rollout_id", "seq", unique=True),
        Index("ix_calls_rollout_agent", "rollout_id", "agent"),
    )


class Reward(Base):
    __tablename__ = "rewards"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollouts.id"), index=True)
    call_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    kind: Mapped[str] = mapped_column(String(16))  # outcome | process
    name: Mapped[str] = mapped_column(String(64), default="reward")
    value: Mapped[float] = mapped_column(Float)
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)

    # the viewer's reward-range filter and reward sort read outcome values from this index
    __table_args__ = (Index("ix_rewards_kind_value", "kind", "value"),)


class WeightVersion(Base):
    __tablename__ = "weight_versions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version: Mapped[str] = mapped_column(String(128), unique=True)
    path: Mapped[str | None] = mapped_column(Text, nullable=True)
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


def pack_ids(ids: Any) -> bytes | None:
    if ids is None:
        return None
    return np.asarray(ids, dtype="<i4").tobytes()


def unpack_ids(blob: bytes | None) -> np.ndarray | None:
    if blob is None:
        return None
    return np.frombuffer(blob, dtype="<i4")


def pack_logprobs(values: Any) -> bytes | None:
    if values is None:
        return None
    return np.asarray(values, dtype="<f4").tobytes()


def unpack_logprobs(blob: bytes | None) -> np.ndarray | None:
    if blob is None:
        return None
    return np.frombuffer(blob, dtype="<f4")
