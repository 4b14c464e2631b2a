"""The Gemini CLI home `harnessrl run` writes (harnessrl/app/rollouts/gemini_home.py): the user's own settings
with API-key auth selected, the user's other files linked in, the user's folder untouched; and a
Google SDK program under `harnessrl run`, pointed by the variables alone. The real Gemini CLI
reading them is tests/test_harness_cli.py (-k gemini)."""

import json
import sys

import pytest
from sqlalchemy import select

from harnessrl.app.rollouts.codex_home import codex_home
from harnessrl.app.rollouts.command import RunOptions
from harnessrl.app.rollouts.gemini_home import strip_comments, write_gemini_home
from harnessrl.app.rollouts.run_cmd import run_command
from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call

USER_SETTINGS = """{
  // the user's own choices
  "general": {"vimMode": true},
  "mcpServers": {"docs": {"httpUrl": "https://docs.example.com/mcp"}}, /* a URL's // is no comment */
  "security": {"folderTrust": {"enabled": true}, "auth": {"selectedType": "oauth-personal", "useExternal": false}}
}
"""


@pytest.mark.unit
def test_the_users_settings_are_kept_with_api_key_auth_selected_and_the_users_files_linked(tmp_path):
    user = tmp_path / ".gemini"
    user.mkdir()
    (user / "settings.json").write_text(USER_SETTINGS)
    (user / "GEMINI.md").write_text("be brief")
    env = {"HOME": str(tmp_path), "HARNESSRL_HOME": str(tmp_path / "hrl")}
    with codex_home("http://h/r/ro1/a/main/v1", env) as folder:
        home = write_gemini_home(folder, env)
        written = json.loads((home / ".gemini" / "settings.json").read_text())
        assert (home / ".gemini" / "GEMINI.md").read_text() == "be brief"
    assert not home.exists()  # removed with the run's temporary folder
    assert written == {"general": {"vimMode": True}, "mcpServers": {"docs": {"httpUrl": "https://docs.example.com/mcp"}},
                       "security": {"folderTrust": {"enabled": True},
                                    "auth": {"selectedType": "gemini-api-key", "useExternal": False}}}
    assert (user / "settings.json").read_text() == USER_SETTINGS  # the user's own file is left as it was


@pytest.mark.unit
def test_without_user_settings_only_the_auth_is_written_and_a_broken_file_is_one_line(tmp_path):
    env = {"GEMINI_CLI_HOME": str(tmp_path / "nobody")}
    home = write_gemini_home(tmp_path / "a", env)
    assert sorted(p.name for p in (home / ".gemini").iterdir()) == ["settings.json"]
    assert json.loads((home / ".gemini" / "settings.json").read_text()) == {
        "security": {"auth": {"selectedType": "gemini-api-key"}}}
    (tmp_path / "bad" / ".gemini").mkdir(parents=True)
    (tmp_path / "bad" / ".gemini" / "settings.json").write_text("{not json")
    with pytest.raises(UserError, match="settings.json: cannot read it for Gemini CLI's settings"):
        write_gemini_home(tmp_path / "b", {"GEMINI_CLI_HOME": str(tmp_path / "bad")})


@pytest.mark.unit
def test_comments_are_stripped_outside_strings_only():
    assert json.loads(strip_comments('{"a": "x//y", // c\n "b": "/*z*/" /* d */, "c": "\\"//"}')) == {
        "a": "x//y", "b": "/*z*/", "c": '"//'}


# A Gemini API program as a user writes it, no base URL or key in the code: google-genai reads
# GOOGLE_GEMINI_BASE_URL and GOOGLE_API_KEY / GEMINI_API_KEY from the environment.
PROGRAM = """
import json, os, sys
from pathlib import Path
from google import genai
from google.genai import types
client = genai.Client(http_options=types.HttpOptions(retry_options=types.HttpRetryOptions(attempts=1)))
answer = client.models.generate_content(model="standin", contents="hello from gemini")
home = Path(os.environ["GEMINI_CLI_HOME"])
Path(sys.argv[1]).write_text(json.dumps({"text": answer.text, "home": str(home),
    "settings": json.loads((home / ".gemini" / "settings.json").read_text()),
    "keys": [os.environ["GEMINI_API_KEY"], os.environ["GOOGLE_API_KEY"]], "rollout": os.environ["HARNESSRL_ROLLOUT"]}))
"""


def test_a_gemini_program_under_run_reaches_its_rollout_with_the_rollouts_key_only(upstream, tmp_path, monkeypatch):
    """Before, `run` set no Gemini variable: the program called generativelanguage.googleapis.com."""
    user = tmp_path / "home" / ".gemini"
    user.mkdir(parents=True)
    (user / "settings.json").write_text(USER_SETTINGS)
    own = {"GEMINI_API_KEY": "AIzaSyUsersOwnGeminiKey0123456789abcdef",
           "GOOGLE_API_KEY": "AIzaSyUsersOwnGoogleKey0123456789abcde"}
    for name, value in {**own, "HOME": str(tmp_path / "home"), "HARNESSRL_HOME": str(tmp_path / "hrl")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GEMINI_CLI_HOME", raising=False)
    program, report = tmp_path / "program.py", tmp_path / "report.json"
    program.write_text(PROGRAM)
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        code = run_command([sys.executable, str(program), str(report)], RunOptions(task="t", reward_from="exit-code"),
                           proxy.url, None, db, None)
    assert code == 0
    got = json.loads(report.read_text())
    assert got["settings"]["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert got["settings"]["general"] == {"vimMode": True}  # the user's own settings kept
    assert (user / "settings.json").read_text() == USER_SETTINGS and not (tmp_path / got["home"]).exists()
    # both of the program's keys are the rollout's own, not the user's
    assert got["keys"][0] == got["keys"][1] and got["keys"][0].startswith(f"hrl-{got['rollout']}"), got["keys"]
    _, Session = open_db(db)
    with Session() as s:
        (call,) = s.scalars(select(Call).where(Call.rollout_id == got["rollout"]))
    assert (call.surface, call.status) == ("gemini", "ok") and call.completion_ids and got["text"]
    assert not any(key.encode() in (tmp_path / "runs.db").read_bytes() for key in own.values())
