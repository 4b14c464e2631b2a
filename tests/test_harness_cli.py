"""The real harnesses of harnesses.lock in their default configuration — Claude Code, Codex CLI,
OpenCode, mini-swe-agent, aider, the OpenAI Agents SDK, Gemini CLI, Kilo Code CLI and smolagents
(ToolCallingAgent and CodeAgent) — each by its own base-URL setting, under `harnessrl run`, and
under `harnessrl run` with no base URL at all (interception only), against the proxy over a
scripted vLLM stand-in (tests/harness_cli.py). One harness alone:
`pytest tests/test_harness_cli.py -k codex`."""

import json
import subprocess

import harness_cli as hc
import pytest

pytestmark = pytest.mark.harness
NAMES = tuple(hc.HARNESSES)
TOOL_USERS = tuple(n for n in NAMES if n != "aider")  # aider has no tools: its result is the edited file
SMOLAGENTS = tuple(n for n in NAMES if hc.HARNESSES[n].pin == "smolagents")


@pytest.fixture(scope="session")
def sessions(tokenizer_dir, tmp_path_factory):
    """Each harness's three runs, made once (on first use) for every test that reads them."""
    made: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in made:
            made[name] = hc.session(name, tokenizer_dir, tmp_path_factory.mktemp(name))
        return made[name]
    return get


@pytest.mark.parametrize("mode", hc.MODES)
@pytest.mark.parametrize("name", NAMES)
def test_the_run_completes(sessions, name, mode):
    hc.check_completed(sessions(name), mode)


@pytest.mark.parametrize("mode", hc.MODES)
@pytest.mark.parametrize("name", NAMES)
def test_every_call_is_recorded_ok_with_token_ids(sessions, name, mode):
    if name in TOOL_USERS:
        hc.check_calls(sessions(name), mode)
    else:
        hc.check_calls(sessions(name), mode, min_calls=1, tool=False)


@pytest.mark.parametrize("mode", hc.MODES)
@pytest.mark.parametrize("name", TOOL_USERS)
def test_the_turn_after_the_tool_extends_the_turn_before(sessions, name, mode):
    hc.check_merged(sessions(name), mode)


@pytest.mark.parametrize("name", NAMES)
def test_compile_yields_samples_of_every_run(sessions, name):
    hc.check_compiled(sessions(name))


@pytest.mark.parametrize("name", NAMES)
def test_no_api_key_is_stored_or_logged(sessions, name):
    hc.check_no_keys(sessions(name))


# ---- what one harness does of its own ----------------------------------------------------------

def test_codex_posts_responses_when_pointed_and_opens_the_responses_websocket_when_not(sessions):
    session = sessions("codex")
    surfaces = {mode: {c.surface for c in hc.calls(session, mode)} for mode in hc.MODES}
    # its built-in OpenAI provider (api.openai.com, caught by mitmdump) speaks the WebSocket first
    assert surfaces == {"base-url": {"responses"}, "run": {"responses"}, "intercept": {"responses-ws"}}


@pytest.mark.parametrize("mode", hc.MODES)
def test_aider_applies_and_commits_its_edit(sessions, mode):
    session = sessions("aider")
    assert session["results"][mode]["files"]["hello.py"] == 'print("hrl-aider-ok")\n', hc._explain(session, mode)
    log = subprocess.run(["git", "log", "--format=%s", "-p", "-1"], cwd=session["out"] / f"work-{mode}",
                         capture_output=True, text=True).stdout
    assert '+print("hrl-aider-ok")' in log


@pytest.mark.parametrize("mode", hc.MODES)
def test_mini_swe_agent_ends_on_its_submit_command_after_seeing_the_output(sessions, mode):
    last = hc.calls(sessions("mini-swe-agent"), mode)[-1]
    assert "hrl-tool-ran" in str(last.request["messages"][-1])
    assert [c["function"]["name"] for c in last.tool_calls or []] == ["bash"]
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in last.tool_calls[0]["function"]["arguments"]


@pytest.mark.parametrize("mode", hc.MODES)
def test_the_agents_sdk_triage_agent_hands_off_and_the_shell_agent_runs_its_tool(sessions, mode):
    offered = [[t["function"]["name"] for t in c.request.get("tools", [])]
               for c in hc.calls(sessions("openai-agents"), mode)]
    assert offered[0] == ["transfer_to_shell_agent"]  # the triage agent's only tool is its handoff
    assert offered[1:] and all(names == ["bash"] for names in offered[1:]), offered


def _surfaces(session: dict) -> dict[str, set[str]]:
    return {mode: {c.surface for c in hc.calls(session, mode)} for mode in session["results"]}


def test_gemini_cli_speaks_the_gemini_api_in_every_mode(sessions):
    # by its base URL, and to generativelanguage.googleapis.com (caught by mitmdump) when unpointed
    assert _surfaces(sessions("gemini-cli")) == dict.fromkeys(hc.MODES, {"gemini"})


def test_kilo_code_speaks_chat_completions_by_base_url_and_anthropic_messages_under_run(sessions):
    # base URL: the OpenAI-compatible provider of its config; under run: its Anthropic provider
    # (ANTHROPIC_API_KEY in the environment), by ANTHROPIC_BASE_URL or through mitmdump
    assert _surfaces(sessions("kilocode")) == {"base-url": {"chat"}, "run": {"messages"}, "intercept": {"messages"}}


@pytest.mark.parametrize("name", SMOLAGENTS)
def test_smolagents_through_a_pass_through_proxy_completes_with_every_call_recorded(sessions, name):
    hc.check_completed(sessions(name), hc.PASS_THROUGH)
    hc.check_calls(sessions(name), hc.PASS_THROUGH)


def _rollout_stats(session: dict, mode: str) -> dict:
    assert session["compile"].returncode == 0, session["compile"].stderr[-3000:]
    stats = json.loads((session["out"] / "samples" / "stats.json").read_text())
    return stats["rollouts"][session["results"][mode]["rollout"]]


@pytest.mark.parametrize("mode", hc.MODES)
@pytest.mark.parametrize("name", SMOLAGENTS)
def test_smolagents_sessions_compile_to_one_tree_per_agent(sessions, name, mode):
    """smolagents sends its own turns back rewritten as text (the tool calls as "Calling tools: [...]",
    results as `Observation:` user turns, CodeAgent's code with its `</code>` stop added): in prefix
    mode its five-step session (four runs, then the answer) is still one sequence, one sample of five
    merged calls, not five samples paying the whole prompt each (issue 44: token saving > 2)."""
    got = _rollout_stats(sessions(name), mode)
    assert (got["calls"], got["samples"], got.get("merges")) == (5, 1, 4), got
    assert got["tokens_recorded"] / got["tokens_emitted"] > 2, got


@pytest.mark.parametrize("name", SMOLAGENTS)
def test_smolagents_rewrites_through_a_pass_through_proxy_are_counted_not_silently_split(sessions, name):
    """A pass-through proxy sends the harness's rewritten text to the model as it is, so the next
    prompt is not the sampled tokens and cannot extend them: each later call names the rewrite rule
    that recognised the reply, and compile counts them (`unmerged_rewrites`) beside its samples."""
    session = sessions(name)
    got = _rollout_stats(session, hc.PASS_THROUGH)
    assert (got["calls"], got["samples"], got.get("unmerged_rewrites")) == (5, 5, 4), got
    rules = [(c.request.get("harnessrl_rewrite") or {}).get("rule") for c in hc.calls(session, hc.PASS_THROUGH)]
    assert rules[0] is None and len(set(rules[1:])) == 1 and rules[1].startswith("smolagents"), rules
