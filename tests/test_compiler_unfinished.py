"""What compile leaves out of training: a session's last turn cut by max_tokens (with
`--mask-truncated`) and calls recorded as text only (a provider without token ids)."""

from __future__ import annotations

import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from harnessrl.compiler.pipeline import CompileOptions, Compiler
from harnessrl.db import open_db
from harnessrl.records import TEXT_ONLY, Call, Reward, Rollout, pack_ids


@pytest.fixture
def db(tmp_path, tiny_model_dir):
    """Two rollouts of one group; in each, a 2-call session whose second call extends the first.
    In r1 the second call was cut by max_tokens. r2 also has a text-only call of another agent."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    target = str(tmp_path / "runs.db")
    _, make = open_db(target)
    first_prompt, first = enc("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), enc("Hello") + [tok.eos_token_id]
    second_prompt = first_prompt + first + enc("\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n")
    second = enc("A long answer that was")
    now = time.time()
    with make.begin() as s:
        for rid, reward, finish in (("r1", 1.0, "length"), ("r2", 0.0, "stop")):
            s.add(Rollout(id=rid, task_id="t", group_id="g", status="finished", next_seq=0, created_at=now))
            s.flush()
            s.add(Reward(rollout_id=rid, kind="outcome", name="outcome", value=reward, created_at=now))
            for seq, (cid, p, c, fr) in enumerate(((f"{rid}a", first_prompt, first, "stop"),
                                                   (f"{rid}b", second_prompt, second, finish))):
                s.add(Call(id=cid, rollout_id=rid, seq=seq, agent="solo", endpoint="chat", request={"messages": []},
                           response_text="x", status="ok", prompt_ids=pack_ids(p), completion_ids=pack_ids(c),
                           finish_reason=fr, prompt_path="prefix", created_at=now))
        s.add(Call(id="r2t", rollout_id="r2", seq=2, agent="teacher", endpoint="chat",
                   request={"messages": [{"role": "user", "content": "q"}]}, response_text="text only", status="ok",
                   prompt_path=TEXT_ONLY, finish_reason="stop", created_at=now))
    return target, len(first_prompt), len(first), len(second_prompt), len(second)


def _compile(db, tmp_path, tiny_model_dir, **kw):
    out = tmp_path / ("out" + str(len(kw)))
    stats = Compiler(db, CompileOptions(out=out, tokenizer=str(tiny_model_dir), train_agents="all", **kw)).run()["totals"]
    rows = {r["rollout_id"]: r for r in pq.read_table(out / "samples.parquet").to_pylist()}
    return stats, rows


def test_truncated_last_turn_is_masked_only_when_asked(db, tmp_path, tiny_model_dir):
    target, p1, c1, p2, c2 = db
    stats, rows = _compile(target, tmp_path, tiny_model_dir)
    mask = np.array(rows["r1"]["loss_mask"])
    assert mask[p1:p1 + c1].all() and mask[p2:p2 + c2].all() and stats["masked_truncated"] == 0

    stats, rows = _compile(target, tmp_path, tiny_model_dir, mask_truncated=True)
    mask = np.array(rows["r1"]["loss_mask"])
    assert mask[p1:p1 + c1].all()  # the finished first turn still trains
    assert not mask[p2:].any() and mask.sum() == c1  # the unfinished last turn does not
    assert np.array(rows["r2"]["loss_mask"]).sum() == c1 + c2  # a session that finished its turn is untouched
    assert stats["masked_truncated"] == 1


def test_text_only_calls_are_counted_never_samples(db, tmp_path, tiny_model_dir):
    target, *_ = db
    stats, rows = _compile(target, tmp_path, tiny_model_dir)
    assert stats["text_only"] == 1 and stats["retokenized"] == 0  # not re-rendered into fake ids either
    assert sorted(rows) == ["r1", "r2"] and all(r["agent"] == "solo" for r in rows.values())
