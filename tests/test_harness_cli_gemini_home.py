"""The Gemini CLI home `harnessrl run` writes (harnessrl/app/gemini_home.py): the user's own settings
with API-key auth selected, the user's other files linked in, the user's folder untouched; the real
Gemini CLI reading it is tests/test_harness_cli.py (-k gemini)."""

import json

import pytest

from harnessrl.app.codex_home import codex_home
from harnessrl.app.gemini_home import strip_comments, write_gemini_home
from harnessrl.errors import UserError

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
