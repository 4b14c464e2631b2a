"""Codex CLI (npm @openai/codex, harnesses.lock) in its default configuration: `codex exec TASK`
by a provider in ~/.codex/config.toml and under `harnessrl run`, with and without it
(tests/harness_cli.py)."""

import harness_cli as hc
import pytest

pytestmark = pytest.mark.harness
NAME = "codex"


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


def test_pointed_at_the_proxy_it_posts_responses_and_unpointed_it_opens_the_responses_websocket(session):
    surfaces = {mode: {c.surface for c in hc.calls(session, mode)} for mode in hc.MODES}
    # its built-in OpenAI provider (api.openai.com, caught by mitmdump) speaks the WebSocket first
    assert surfaces == {"base-url": {"responses"}, "run": {"responses"}, "intercept": {"responses-ws"}}
