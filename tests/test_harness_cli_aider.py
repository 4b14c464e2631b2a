"""aider (PyPI aider-chat, harnesses.lock; own venv) in its default configuration (whole-file edit
format for an unknown model, git auto-commits): `aider --message … hello.py` by OPENAI_API_BASE
and under `harnessrl run`, with and without it (tests/harness_cli.py). It has no tools: its
result is the edited file."""

import subprocess

import harness_cli as hc
import pytest

pytestmark = pytest.mark.harness
NAME = "aider"


@pytest.fixture(scope="module")
def session(tokenizer_dir, tmp_path_factory):
    return hc.session(NAME, tokenizer_dir, tmp_path_factory.mktemp(NAME))


@pytest.mark.parametrize("mode", hc.MODES)
def test_the_run_completes_and_the_edit_is_applied_and_committed(session, mode):
    hc.check_completed(session, mode)
    assert session["results"][mode]["files"]["hello.py"] == 'print("hrl-aider-ok")\n', hc._explain(session, mode)
    log = subprocess.run(["git", "log", "--format=%s", "-p", "-1"], cwd=session["out"] / f"work-{mode}",
                         capture_output=True, text=True).stdout
    assert '+print("hrl-aider-ok")' in log  # aider committed its edit


@pytest.mark.parametrize("mode", hc.MODES)
def test_every_call_is_recorded_ok_with_token_ids(session, mode):
    hc.check_calls(session, mode, min_calls=1, tool=False)


def test_compile_yields_samples_of_every_run(session):
    hc.check_compiled(session)


def test_no_api_key_is_stored_or_logged(session):
    hc.check_no_keys(session)
