"""The prefix index is bounded by bytes and shares conversation history between turns (issue 12,
defect 7): growing conversations stay under the cap by the index's own byte counter, the least
recently used sessions go first, and that counter is an honest estimate of what it holds."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from harnessrl.proxy.prefix.index import PrefixIndex, Turn

EOS = frozenset({2})


def _conversation(index: PrefixIndex, key: tuple, turns: int, words: int = 60) -> list[Turn]:
    """A session that grows turn by turn, each call extending the last, as the proxy records it."""
    messages: list[dict] = [{"role": "system", "content": "You are terse. " * 20}]
    ids: list[int] = list(range(3, 200))
    made = []
    for t in range(turns):
        messages = [*messages, {"role": "user", "content": f"question {t}: " + "word " * words}]
        parent = index.find(key, messages, None)
        prompt = ids + [2] + list(range(5, 5 + words)) if parent is not None else ids
        reply = {"role": "assistant", "content": f"answer {t} " + "token " * words}
        completion = list(range(7, 7 + words)) + [2]
        turn = Turn.of(f"{key[2]}-{t}", messages, None, reply, prompt, completion, EOS, parent)
        index.add(key, turn)
        made.append(turn)
        messages = [*messages, dict(reply)]  # the harness echoes the reply back (its own copy)
        ids = prompt + completion
    return made


@pytest.mark.unit
def test_turns_share_their_history_and_rebuild_it_exactly():
    index = PrefixIndex()
    turns = _conversation(index, ("r", "a", "s"), 30)
    last = turns[-1]
    assert all(t.parent is p for t, p in zip(turns[1:], turns))
    assert len(last.messages) == last.n_messages == 60 and last.messages[0]["role"] == "system"
    assert last.exact.tolist()[: turns[-2].n_ids] == turns[-2].exact.tolist() and len(last.exact) == last.n_ids
    # 8 turns are findable, but history is held once: bytes grow with the conversation, not 8x it
    assert sum(t.nbytes for t in turns) == index.nbytes
    assert index.nbytes < 2 * sum(t.nbytes for t in turns[-8:]) + sum(t.nbytes for t in turns[:-8])


@pytest.mark.unit
def test_growing_conversations_stay_under_the_byte_cap_and_evict_least_recently_used():
    cap = 256 * 1024  # about 8 of these sessions
    index = PrefixIndex(max_bytes=cap)
    keys = [("r", "a", f"s{i}") for i in range(40)]
    for key in keys:
        _conversation(index, key, 12)
        assert 0 < index.nbytes <= cap
    live = [k for k in keys if k in index]
    assert 1 < len(live) < len(keys) and live == keys[-len(live):]  # the oldest went first
    _conversation(index, live[0], 1)  # the oldest session is used again...
    _conversation(index, ("r", "a", "new"), 12)
    assert index.nbytes <= cap
    assert live[0] in index and live[1] not in index  # ...so the next oldest goes instead


@pytest.mark.unit
def test_one_session_larger_than_the_cap_is_not_kept():
    index = PrefixIndex(max_bytes=50_000)
    _conversation(index, ("r", "a", "huge"), 40, words=400)
    assert index.nbytes <= 50_000


@pytest.mark.unit
def test_the_byte_counter_matches_what_the_index_holds():
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = PrefixIndex()
    for i in range(20):
        _conversation(index, ("r", "a", f"s{i}"), 10)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    # an estimate that errs high, but not by much: within [1x, 3x] of the allocations it keeps
    assert held <= index.nbytes <= 3 * held, (held, index.nbytes)


@pytest.mark.unit
def test_forgetting_a_rollout_returns_its_bytes():
    index = PrefixIndex()
    _conversation(index, ("r1", "a", "s"), 5)
    kept = index.nbytes
    _conversation(index, ("r2", "a", "s"), 5)
    index.forget("r2")
    assert index.nbytes == kept
    index.forget("r1")
    assert index.nbytes == 0
