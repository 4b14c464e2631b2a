"""Volatile spans (docs/methods.md §2): Claude Code under interception stamps a fresh `cch=<hash>;`
into the billing line at the top of its system prompt on every call, so no turn's prompt extends
the previous one. With the built-in rule (or a `--volatile-pattern`) the proxy sends each later
call the session's first value: the prompts extend exactly, the session compiles to one sample,
and the records keep the harness's own text with the spans held. Driven by the anthropic SDK over
a real socket, on the local tiny model, recorded in SQLite, then compiled."""

from __future__ import annotations

import itertools
import subprocess
import sys

import anthropic
import pytest

from harnessrl.errors import UserError
from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.proxy.prefix.index import PrefixIndex, Turn
from harnessrl.proxy.prefix.volatile import Volatile
from harnessrl.records import unpack_ids
from surface_fixtures import Target, assert_extends, assert_merged, calls, compile_rollouts

TOOLS = [{"name": "lookup", "description": "Look a word up.",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}]
# Claude Code 2.1.197's billing line, as captured with its base URL taken for api.anthropic.com
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.c40; cc_entrypoint=sdk-cli; {key}={hash};"
HASHES = ("5ae77", "f2a00", "78d0f", "0c41b")
TURNS = len(HASHES)


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    b = LocalBackend(tiny_model_dir, seed=0)
    yield b
    b.close()


def _claude_code_session(url: str, rollout: str, key: str) -> None:
    """A Claude-Code-shaped tool loop: system blocks with a fresh hash each call, the rollout in a
    header and no agent (as `harnessrl run` sets it), tool results for every tool use."""
    c = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0,
                            default_headers={"x-harnessrl-rollout": rollout})
    messages: list[dict] = [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\n# currentDate\nToday's date is 2026-12-04.\n</system-reminder>\n"},
        {"type": "text", "text": "Search for the capital of spain, then answer.",
         "cache_control": {"type": "ephemeral"}}]}]
    for turn, h in enumerate(HASHES):
        system = [{"type": "text", "text": BILLING.format(key=key, hash=h)},
                  {"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
                   "cache_control": {"type": "ephemeral"}}]
        m = c.messages.create(model="claude-opus-4-8", max_tokens=64, system=system, tools=TOOLS,
                              messages=messages, extra_body={"temperature": 0})
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
        results = [{"type": "tool_result", "tool_use_id": b.id, "content": f"result {turn}: madrid"}
                   for b in m.content if b.type == "tool_use"]
        messages.append({"role": "user", "content": results or "Go on."})


def _run(tmp_path, backend, model_dir, key: str, patterns: tuple[str, ...] = ()):
    tmp_path.mkdir(exist_ok=True)
    db = str(tmp_path / f"{key}.db")
    cfg = ProxyConfig(db=db, backend="local", model=str(model_dir), port=0, volatile_patterns=patterns)
    with run_proxy(cfg, backend=backend) as proxy:
        _claude_code_session(proxy.url, "cc", key)
    rows = calls(db, "cc")
    assert len(rows) == TURNS and all(r.status == "ok" for r in rows)
    return Target("local", proxy.url, db, str(model_dir)), rows


def test_changing_cch_is_held_and_the_session_merges(backend, tiny_model_dir, tmp_path):
    target, rows = _run(tmp_path, backend, tiny_model_dir, "cch")
    # one agent, named from the model and the system prompt without its volatile span
    assert len({r.agent for r in rows}) == 1 and rows[0].agent.startswith("claude-opus-4-8@")
    # the record keeps what the harness sent; the model got the session's first hash
    for r, h in zip(rows, HASHES):
        assert r.request["messages"][0]["content"].startswith(BILLING.format(key="cch", hash=h))
        assert r.request["harnessrl_surface"]["body"]["system"][0]["text"].endswith(f"cch={h};")
        prompt = backend.decode(unpack_ids(r.prompt_ids).tolist())
        assert "cch=5ae77;" in prompt and (h == HASHES[0] or f"cch={h}" not in prompt)
    assert "harnessrl_held" not in rows[0].request
    for prev, r, h in zip(rows, rows[1:], HASHES[1:]):
        assert r.request["harnessrl_held"] == {"call": prev.id, "spans": [
            {"message": 0, "sent": "cch=5ae77;", "harness": f"cch={h};"}]}
        assert_extends(prev, r)
    totals = compile_rollouts(target, ("cc",), tmp_path / "out")
    assert_merged(totals, rows, sessions=1)
    # one sample of the whole session instead of one per call: the saving is the sum of the calls'
    # prompt + completion tokens over the last call's (the sample holds each token once)
    last = rows[-1]
    assert totals["tokens_emitted"] == len(unpack_ids(last.prompt_ids)) + len(unpack_ids(last.completion_ids))


def test_an_unknown_changing_span_splits_every_turn_until_named(backend, tiny_model_dir, tmp_path):
    # the failure the rule fixes: a span the proxy does not know makes every call a new root
    target, rows = _run(tmp_path, backend, tiny_model_dir, "ccx")
    assert [r.prompt_path for r in rows] == ["render"] * TURNS and {r.prefix_call_id for r in rows} == {None}
    assert len({r.agent for r in rows}) == TURNS  # nor can the fingerprint tell it is one agent
    totals = compile_rollouts(target, ("cc",), tmp_path / "out")
    assert (totals["samples"], totals["merges"], totals["token_saving"]) == (TURNS, 0, 1.0)
    # named with --volatile-pattern, the same session merges
    target, rows = _run(tmp_path / "named", backend, tiny_model_dir, "ccx", (r"\bccx=[0-9a-f]+;",))
    assert len({r.agent for r in rows}) == 1
    assert [r.request["harnessrl_held"]["spans"][0]["sent"] for r in rows[1:]] == ["ccx=5ae77;"] * (TURNS - 1)
    assert_merged(compile_rollouts(target, ("cc",), tmp_path / "out2"), rows, sessions=1)


def test_bad_volatile_patterns_stop_the_start(tmp_path):
    for bad, why in (("(", "not a regular expression"), ("x*", "matches the empty string")):
        with pytest.raises(UserError, match=why):
            ProxyConfig(db=str(tmp_path / "r.db"), backend="local", model="m", volatile_patterns=(bad,)).check()


class _CountingVolatile(Volatile):
    def __init__(self) -> None:
        super().__init__()
        self.masked = 0

    def mask(self, text: str) -> str:
        self.masked += 1
        return super().mask(text)


def test_the_volatile_check_costs_nothing_when_a_call_extends_exactly():
    vol, index, key = _CountingVolatile(), PrefixIndex(), ("r", None, None)
    messages = [{"role": "system", "content": BILLING.format(key="cch", hash="5ae77")},
                {"role": "user", "content": "hi"}]
    ids = itertools.count()
    turn = None
    for i in range(3):
        reply = {"role": "assistant", "content": f"answer {i}"}
        turn = Turn.of(f"c{i}", messages, None, reply, [next(ids) for _ in range(5)], [next(ids), 0], {0}, turn)
        index.add(key, turn)
        messages = [*messages, reply, {"role": "user", "content": f"more {i}"}]
    found, held = index.match(key, messages, None, vol)
    assert (found, held, vol.masked) == (turn, [], 0)
    # the same call with a new hash: found through the volatile rule, its system message held
    changed = [{**messages[0], "content": BILLING.format(key="cch", hash="f2a00")}, *messages[1:]]
    found, held = index.match(key, changed, None, vol)
    assert (found, held) == (turn, [0]) and vol.masked > 0
    # without the rule (no prefix mode) it extends nothing
    assert index.match(key, changed, None) == (None, [])


def test_the_cli_refuses_a_bad_pattern_before_serving(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harnessrl", "proxy", "--db", str(tmp_path / "r.db"),
                           "--backend", "local", "--model", str(tmp_path), "--volatile-pattern", "cch=[0-9a-f]+;",
                           "--volatile-pattern", "("], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--volatile-pattern '(' is not a regular expression" in done.stderr


def test_the_built_in_date_lines_differ_only_inside_their_spans():
    vol = Volatile()
    before = ("x-anthropic-billing-header: cc_version=2.1.197.c40; cc_entrypoint=sdk-cli; cch=5ae77;\n"
              "Today's date is 2026-12-04.\n  Today's date: Fri Dec 04 2026\n<current_date>2026-12-04</current_date>")
    after = before.replace("5ae77", "f2a00").replace("12-04", "12-05").replace("Fri Dec 04", "Sat Dec 05")
    assert before != after and vol.mask(before) == vol.mask(after) and vol.fingerprint(before) == vol.fingerprint(after)
    assert vol.held(before, after) == [["cch=5ae77;", "cch=f2a00;"],
                                       ["Today's date is 2026-12-04", "Today's date is 2026-12-05"],
                                       ["Today's date: Fri Dec 04 2026", "Today's date: Sat Dec 05 2026"],
                                       ["<current_date>2026-12-04</current_date>",
                                        "<current_date>2026-12-05</current_date>"]]
    # a change outside the spans is a change
    assert vol.mask(before) != vol.mask(before.replace("sdk-cli", "cli"))
