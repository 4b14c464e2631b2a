"""mini-swe-agent (PyPI, harnesses.lock; own venv) in its default configuration (mini.yaml: a
`bash` tool): `mini -t TASK -y` by OPENAI_API_BASE and under `harnessrl run`, with and without
it (tests/harness_cli.py)."""

import harness_cli as hc
import pytest

pytestmark = pytest.mark.harness
NAME = "mini-swe-agent"


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
def test_it_ends_on_its_submit_command_after_seeing_the_output(session, mode):
    last = hc.calls(session, mode)[-1]
    assert "hrl-tool-ran" in str(last.request["messages"][-1])
    assert [c["function"]["name"] for c in last.tool_calls or []] == ["bash"]
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in last.tool_calls[0]["function"]["arguments"]
