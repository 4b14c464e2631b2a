"""Sessions that merge through a harness's own rewrite (docs/methods.md §2, `proxy/prefix/rewrites.py`).

smolagents 1.26 sends the model's earlier turns back as text of its own — the assistant turn as
`"…</think>\\nCalling tools:\\n[{'id': …}]"` without `tool_calls`, tool results as user
`Observation:` messages, CodeAgent's code with the `</code>` it stopped on appended — so the
recorded completion never appeared in the next prompt: 5 calls, 5 samples, 0 merges. A real
ToolCallingAgent and CodeAgent (`OpenAIServerModel` at a rollout path) run five steps against the
proxy in prefix mode over the vLLM stand-in, whose "model" is scripted here like an agent; then
the records are compiled. A harness without a built-in rule is driven by the OpenAI SDK."""

from __future__ import annotations

import json

import openai
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from harnessrl.compiler.inspect_rollout import rollout_tree
from harnessrl.compiler.summary import summary_notes, summary_table
from harnessrl.errors import UserError
from harnessrl.proxy.prefix.index import PrefixIndex, Turn, same_message
from harnessrl.proxy.prefix.rewrites import Rewrites
from harnessrl.proxy.prefix.volatile import Volatile
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import unpack_ids
from surface_fixtures import Target, assert_extends, calls, compile_rollouts

smolagents = pytest.importorskip("smolagents")
STEPS = 5
THINK = "<think>\nI look it up.\n</think>\n\n"


def _observations(prompt: str) -> int:
    return prompt.count("result for q")  # what the lookup tool returned, in the harness's observations


def script(prompt: str) -> str:
    """An agent's reply to the rendered prompt: a lookup per step, the final answer at the fifth.
    With tools (ToolCallingAgent) hermes tool calls; else (CodeAgent) a code block, every other
    one cut before `</code>` as a stop string leaves it (smolagents appends it)."""
    n = _observations(prompt)
    if "<tools>" in prompt:
        call = {"name": "lookup", "arguments": {"query": f"q{n}"}} if n < STEPS - 1 else \
            {"name": "final_answer", "arguments": {"answer": "done"}}
        return f"{THINK}<tool_call>\n{json.dumps(call)}\n</tool_call>"
    if n < STEPS - 1:
        return f"Thought: step {n}.\n<code>\nprint(lookup(query='q{n}'))\n{'</code>' if n % 2 else ''}"
    return "Thought: done.\n<code>\nfinal_answer('done')\n</code>"


@pytest.fixture(scope="module")
def scripted_upstream(tokenizer_dir):
    """The vLLM stand-in whose replies are `script`'s, sampled as its own are (3-character pieces)."""
    from vllm_standin import create_app, run_standin

    app = create_app(str(tokenizer_dir))
    standin = app.state.standin
    specials = ("<think>", "</think>", "<tool_call>", "</tool_call>")

    def reply(prompt_ids, response_format=None):
        text = script(standin.tok.decode(prompt_ids))
        for s in specials:
            text = text.replace(s, f"\0{s}\0")
        ids: list[int] = []
        for part in text.split("\0"):
            if part in specials:
                ids += standin.tok.convert_tokens_to_ids([part])
            else:
                for i in range(0, len(part), 3):
                    ids += standin.tok.encode(part[i:i + 3], add_special_tokens=False)
        ids.append(standin.eos)
        return ids, [-0.5] * len(ids)

    standin.reply = reply
    with run_standin(str(tokenizer_dir), app) as url:
        yield url


tool = smolagents.tool


@tool
def lookup(query: str) -> str:
    """Look a word up.

    Args:
        query: the word.
    """
    return f"result for {query}"


def _run_agents(url: str, steps: int) -> None:
    for rollout, cls in (("tool-calling", smolagents.ToolCallingAgent), ("code", smolagents.CodeAgent)):
        model = smolagents.OpenAIServerModel(model_id="standin", api_base=f"{url}/r/{rollout}/a/main/v1",
                                             api_key="unused")
        agent = cls(tools=[lookup], model=model, max_steps=steps, verbosity_level=0)
        answer = agent.run("Look up q0 to q3, then answer.")
        assert steps < STEPS or answer == "done"


@pytest.fixture(scope="module")
def recorded(scripted_upstream, tokenizer_dir, tmp_path_factory):
    """Both agents' runs, in prefix mode and as a pass-through: {mode: Target}."""
    out = {}
    for mode in ("prefix", "passthrough"):
        db = str(tmp_path_factory.mktemp(mode) / "runs.db")
        cfg = ProxyConfig(db=db, upstream=scripted_upstream, port=0, prefix=mode == "prefix",
                          tokenizer=str(tokenizer_dir))
        with run_proxy(cfg) as proxy:
            # the stand-in's own chat template drops content parts it is sent as a pass-through, so
            # the script never sees an observation there: three steps, then smolagents' final-answer call
            _run_agents(proxy.url, STEPS if mode == "prefix" else 3)
        out[mode] = Target(mode, proxy.url, db, str(tokenizer_dir))
    return out


@pytest.mark.parametrize("rollout,rule", [("tool-calling", "smolagents-tool-calls"), ("code", "smolagents-code")])
def test_a_smolagents_run_compiles_to_one_tree_with_the_sampled_tokens(recorded, rollout, rule, tmp_path):
    target = recorded["prefix"]
    rows = calls(target.db, rollout)
    assert len(rows) == STEPS and all(r.status == "ok" for r in rows)
    for earlier, later in zip(rows, rows[1:]):
        assert_extends(earlier, later)  # each prompt is the previous call's exact prompt + completion ids, then more
    last = rows[-1]
    # the record keeps smolagents' own text; what was sent in its place is noted, rule by rule
    rewritten = [m for m in last.request["messages"] if m["role"] == "assistant"]
    assert len(rewritten) == STEPS - 1 and all("Calling tools:" in m["content"][0]["text"] for m in rewritten)
    assert last.request["harnessrl_held"]["call"] == rows[-2].id
    assert last.request["harnessrl_held"]["rewrites"] == [{"message": 2 + 2 * i, "rule": rule}
                                                          for i in range(STEPS - 1)]
    if rollout == "code":  # smolagents appended the </code> the stop string would have cut
        assert rewritten[0]["content"][0]["text"].startswith("Thought: step 0.\n<code>\nprint(lookup(query='q0'))\n"
                                                             "</code>\nCalling tools:")
    totals = compile_rollouts(target, (rollout,), tmp_path)
    assert (totals["sessions"], totals["samples"], totals["merges"]) == (1, 1, STEPS - 1)
    assert totals["unmerged_rewrites"] == 0 and totals["token_saving"] > 2
    sample = pq.read_table(tmp_path / "samples.parquet").to_pylist()[0]
    ids, mask = sample["input_ids"], sample["loss_mask"]
    assert ids == unpack_ids(last.prompt_ids).tolist() + unpack_ids(last.completion_ids).tolist()
    # the trained tokens are exactly the sampled ones: every call's completion ids, nothing else
    sampled = [t for r in rows for t in unpack_ids(r.completion_ids).tolist()]
    assert [t for t, m in zip(ids, mask) if m] == sampled


def test_as_a_pass_through_the_rewrites_are_counted_not_silently_split(recorded, tmp_path):
    target = recorded["passthrough"]
    for rollout, rule in (("tool-calling", "smolagents-tool-calls"), ("code", "smolagents-code")):
        rows = [r for r in calls(target.db, rollout) if r.agent == "main"]
        assert len(rows) == 4  # three steps, then the final-answer call (its own system prompt: no rewrite)
        notes = [r.request.get("harnessrl_rewrite") for r in rows]
        assert notes[0] is None and notes[-1] is None
        assert all(n is not None and n["rule"] == rule and n["call"] == r.id for n, r in zip(notes[1:3], rows))
    stats_out = tmp_path / "c"
    totals = compile_rollouts(target, ("tool-calling", "code"), stats_out)
    assert totals["merges"] == 0 and totals["unmerged_rewrites"] == 4
    stats = json.loads((stats_out / "stats.json").read_text())
    [note] = [n for n in summary_notes(stats) if "rewrite" in n]
    assert f"{totals['unmerged_rewrites']:,} calls re-sent an earlier reply" in note and "--prefix" in note
    console = Console(record=True, width=120)
    console.print(summary_table(totals))
    assert "new roots: unmerged harness rewrites" in console.export_text()
    # and `harnessrl inspect` says so at each break
    console = Console(record=True, width=400)
    console.print(rollout_tree(target.db, "code", target.tokenizer, 20))
    shown = console.export_text()
    assert shown.count("reply in its own form: rule smolagents-code (pass-through: use --prefix)") == 2


# ---- a harness with no built-in rule: a pattern, not code ------------------------------------

def _action_session(url: str, turns: int = 3) -> None:
    """A harness that re-sends each tool call as `Action: {json}` text and each result as a user
    `Result:` message, through the OpenAI SDK."""
    client = openai.OpenAI(base_url=f"{url}/r/actions/a/main/v1", api_key="unused", max_retries=0)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "Look up q."}]
    for i in range(turns):
        r = client.chat.completions.create(model="standin", messages=messages, tools=tools)
        m = r.choices[0].message
        assert m.tool_calls, m
        calls_json = json.dumps([{"name": c.function.name, "arguments": json.loads(c.function.arguments)}
                                 for c in m.tool_calls])
        messages += [{"role": "assistant", "content": f"{m.content or ''}\nAction: {calls_json}"},
                     {"role": "user", "content": f"Result: result {i}"}]


ACTION_PATTERN = r"(?s)(?P<text>.*)\nAction: (?P<calls>\[.*\])"


@pytest.mark.parametrize("patterns", [(), (ACTION_PATTERN,)], ids=["no rule", "--rewrite-pattern"])
def test_a_new_harness_needs_only_a_pattern(upstream, tokenizer_dir, tmp_path, patterns):
    db = str(tmp_path / "runs.db")
    cfg = ProxyConfig(db=db, upstream=upstream, port=0, prefix=True, tokenizer=str(tokenizer_dir),
                      rewrite_patterns=patterns)
    with run_proxy(cfg) as proxy:
        _action_session(proxy.url)
    rows = calls(db, "actions")
    totals = compile_rollouts(Target("standin", proxy.url, db, str(tokenizer_dir)), ("actions",), tmp_path / "c")
    if patterns:
        assert [r.request["harnessrl_held"]["rewrites"][-1]["rule"] for r in rows[1:]] == ["pattern-1"] * 2
        assert (totals["samples"], totals["merges"], totals["unmerged_rewrites"]) == (1, 2, 0)
    else:
        assert [r.request["harnessrl_rewrite"]["rule"] for r in rows[1:]] == [None, None]
        assert (totals["samples"], totals["merges"], totals["unmerged_rewrites"]) == (3, 0, 2)


# ---- the rule itself ---------------------------------------------------------------------------

REPLY = {"role": "assistant", "content": "<think>\nhm\n</think>\n\n",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "lookup", "arguments": '{"query": "q0"}'}}]}


def _smol(text: str) -> dict:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def test_a_rule_recognises_only_the_turn_the_model_wrote():
    r = Rewrites()
    listing = "[{'id': 'call_1', 'type': 'function', 'function': {'name': 'lookup', 'arguments': {'query': 'q0'}}}]"
    assert r.rule_of(_smol(f"<think>\nhm\n</think>\nCalling tools:\n{listing}"), REPLY) == "smolagents-tool-calls"
    # other arguments, another tool, other text, or no call listed: another turn, never merged on
    for text in (f"<think>\nhm\n</think>\nCalling tools:\n{listing.replace('q0', 'q1')}",
                 f"<think>\nhm\n</think>\nCalling tools:\n{listing.replace('lookup', 'search')}",
                 f"<think>\nno\n</think>\nCalling tools:\n{listing}",
                 "<think>\nhm\n</think>", f"<think>\nhm\n</think>\nCalling tools:\n[{{'id': 'x'}}]",
                 "<think>\nhm\n</think>\nCalling tools:\n[__import__('os')]"):
        assert r.rule_of(_smol(text), REPLY) is None, text
    assert not same_message(_smol(f"<think>\nhm\n</think>\nCalling tools:\n{listing}"), REPLY)


def test_a_rewrite_pattern_without_a_text_group_is_one_line_error():
    with pytest.raises(UserError, match="no \\(\\?P<text>"):
        ProxyConfig(db="x.db", upstream="http://127.0.0.1:9", rewrite_patterns=(r"Action: (?P<calls>.*)",)).check()
    with pytest.raises(UserError, match="not a regular expression"):
        Rewrites(("(?P<text>",))


def test_only_a_reply_the_harness_rewrote_is_noted_not_one_that_differs_in_volatile_spans():
    index, key = PrefixIndex(), ("r", "a", None)
    first = [{"role": "system", "content": "Today's date is 2026-12-05."}, {"role": "user", "content": "Go."}]
    reply = {"role": "assistant", "content": "Checked on 2026-12-05.", "tool_calls": REPLY["tool_calls"]}
    index.add(key, Turn.of("c0", first, None, reply, [1, 2], [3, 4], {4}))
    result = {"role": "user", "content": "Observation: ok"}
    later = [{**first[0], "content": "Today's date is 2026-12-06."}, first[1]]
    dated = {**reply, "content": "Checked on 2026-12-06."}
    rewrite = _smol("Checked on 2026-12-05.\nCalling tools:\n[{'id': 'call_1', 'type': 'function', "
                    "'function': {'name': 'lookup', 'arguments': {'query': 'q0'}}}]")
    volatile, rewrites = Volatile([r"\d{4}-\d{2}-\d{2}"]), Rewrites()
    assert index.rewritten(key, [*later, dated, result], None, volatile, rewrites) is None
    assert index.rewritten(key, [*later, rewrite, result], None, volatile, rewrites).call_id == "c0"
    assert index.match(key, [*later, rewrite, result], None, volatile, rewrites)[1] == [0, 2]
