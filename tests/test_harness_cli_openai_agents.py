"""The OpenAI Agents SDK (PyPI openai-agents, harnesses.lock) in its default configuration: a
triage agent handing off to a shell agent with a function tool, on the Responses API
(tests/harness_clients/agents_triage.py), by OPENAI_BASE_URL and under `harnessrl run`, with
and without it (tests/harness_cli.py)."""

import harness_cli as hc
import pytest

pytestmark = pytest.mark.harness
NAME = "openai-agents"


@pytest.fixture(scope="module")
def session(tokenizer_dir, tmp_path_factory):
    return hc.session(NAME, tokenizer_dir, tmp_path_factory.mktemp(NAME))


@pytest.mark.parametrize("mode", hc.MODES)
def test_the_run_completes_and_answers_with_the_tool_output(session, mode):
    hc.check_completed(session, mode)


@pytest.mark.parametrize("mode", hc.MODES)
def test_every_call_is_recorded_ok_with_token_ids(session, mode):
    hc.check_calls(session, mode)


@pytest.mark.parametrize("mode", hc.MODES)
def test_the_turn_after_the_tool_extends_the_turn_before(session, mode):
    hc.check_merged(session, mode)


def test_compile_yields_samples_of_every_run(session):
    hc.check_compiled(session)


def test_no_api_key_is_stored_or_logged(session):
    hc.check_no_keys(session)


@pytest.mark.parametrize("mode", hc.MODES)
def test_the_triage_agent_hands_off_and_the_shell_agent_runs_its_tool(session, mode):
    offered = [[t["function"]["name"] for t in c.request.get("tools", [])] for c in hc.calls(session, mode)]
    assert offered[0] == ["transfer_to_shell_agent"]  # the triage agent's only tool is its handoff
    assert offered[1:] and all(names == ["bash"] for names in offered[1:]), offered
