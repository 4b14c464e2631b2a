"""Shared by the Responses and Anthropic surface tests: the proxy on three targets — the tiny
model on the local backend, the vLLM stand-in with prefix-consistent prompts (token ids driven by
the proxy) and the stand-in as a plain pass-through upstream — plus record and compile helpers."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select

from harnessrl.compiler.pipeline import CompileOptions, Compiler
from harnessrl.db import open_db
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, unpack_ids, unpack_logprobs

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no network at import

TARGETS = ("local", "standin", "passthrough")


@dataclass
class Target:
    name: str
    url: str
    db: str
    tokenizer: str

    @property
    def tokens(self) -> bool:
        """Whether the proxy builds the prompt ids (prefix-consistent): not for a pass-through."""
        return self.name != "passthrough"


@contextmanager
def serve_target(name: str, tmp_dir, tiny_model_dir, upstream, tokenizer_dir, api_key: str | None = None):
    db = str(tmp_dir / f"{name}.db")
    if name == "local":
        from harnessrl.proxy.local.backend import LocalBackend

        backend = LocalBackend(tiny_model_dir, seed=0)
        try:
            cfg = ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0, api_key=api_key)
            with run_proxy(cfg, backend=backend) as proxy:
                yield Target(name, proxy.url, db, str(tiny_model_dir))
        finally:
            backend.close()
        return
    cfg = ProxyConfig(db=db, upstream=upstream, port=0, prefix=name == "standin", tokenizer=str(tokenizer_dir),
                      api_key=api_key)
    with run_proxy(cfg) as proxy:
        yield Target(name, proxy.url, db, str(tokenizer_dir))


def calls(db: str, rollout: str | None = None) -> list[Call]:
    engine, Session = open_db(db)
    with Session() as s:
        q = select(Call).order_by(Call.rollout_id, Call.seq)
        if rollout is not None:
            q = q.where(Call.rollout_id == rollout)
        rows = list(s.scalars(q))
    engine.dispose()
    return rows


def assert_recorded(c: Call) -> tuple[list[int], list[int]]:
    """A successful call recorded with prompt ids, completion ids and one log-prob per token."""
    assert c.status == "ok" and c.endpoint == "chat", (c.status, c.error)
    prompt, completion = unpack_ids(c.prompt_ids).tolist(), unpack_ids(c.completion_ids).tolist()
    lps = unpack_logprobs(c.completion_logprobs)
    assert prompt and completion and len(lps) == len(completion) and np.all(lps <= 0)
    return prompt, completion


def assert_extends(earlier: Call, later: Call) -> None:
    """`later`'s prompt is `earlier`'s exact prompt + completion ids, then the new turn (whether a
    re-render would have drifted — the stand-in's sampled ids always do — is beside the point)."""
    p0, c0 = assert_recorded(earlier)
    p1, _ = assert_recorded(later)
    assert later.prefix_call_id == earlier.id and later.prompt_path == "prefix"
    assert p1[:len(p0) + len(c0)] == p0 + c0 and len(p1) > len(p0) + len(c0)


def compile_rollouts(target: Target, rollouts: tuple[str, ...], out) -> dict:
    """Compile `rollouts` (outcome 0 where none was reported); its totals."""
    opts = CompileOptions(out=out, train_agents="all", rollouts=rollouts, tokenizer=target.tokenizer,
                          missing_outcome="zero")
    return Compiler(target.db, opts).run()["totals"]


def assert_merged(totals: dict, rows: list[Call], sessions: int) -> None:
    """Each session's calls merged into one sample, as chat's are; the token saving is Σ|S_c| over
    the tokens emitted, so above 1 for any merged conversation."""
    assert (totals["samples"], totals["merges"], totals["roots_drift"]) == (sessions, len(rows) - sessions, 0)
    recorded = sum(len(unpack_ids(c.prompt_ids)) + len(unpack_ids(c.completion_ids)) for c in rows)
    assert totals["tokens_recorded"] == recorded
    assert totals["token_saving"] == recorded / totals["tokens_emitted"] > 1
