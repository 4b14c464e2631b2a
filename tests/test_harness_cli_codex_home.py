"""The Codex configuration `harnessrl run` writes (harnessrl/app/rollouts/codex_home.py): the user's own
config.toml with the rollout's provider selected, read back with a TOML parser; the real Codex
reading it is tests/test_harness_cli_codex.py."""

import tomllib

import pytest

from harnessrl.app.rollouts.codex_home import KEY_ENV, PROVIDER, codex_home
from harnessrl.errors import UserError

USER_CONFIG = '''model = "gpt-x"
profile = "work"
notify = ["notify-send", "Codex \\u00e9"]

[model_providers.mine]
name = "Mine"
base_url = "https://llm.example.com/v1"

[profiles.work]
model_provider = "mine"
approval_policy = "never"

[mcp_servers."docs.search"]
command = "npx"
args = ["-y", "docs"]
env = { TOKEN_FILE = "/run/token" }
'''


@pytest.mark.unit
def test_the_users_config_is_kept_and_the_rollouts_provider_selected(tmp_path):
    user = tmp_path / "user-codex"
    user.mkdir()
    (user / "config.toml").write_text(USER_CONFIG)
    (user / "AGENTS.md").write_text("be brief")
    env = {"CODEX_HOME": str(user), "HARNESSRL_HOME": str(tmp_path / "hrl")}
    with codex_home("http://127.0.0.1:9/r/ro1/a/main/v1", env) as home:
        config = tomllib.loads((home / "config.toml").read_text())
        assert (home / "AGENTS.md").read_text() == "be brief"  # the user's other files are linked in
        assert home.parent == tmp_path / "hrl" / "codex"  # not /tmp: Codex refuses helper binaries there
    assert not home.exists()  # removed with the block
    assert config["model_provider"] == PROVIDER
    assert config["model_providers"][PROVIDER] == {"name": "harnessrl", "env_key": KEY_ENV, "wire_api": "responses",
                                                   "base_url": "http://127.0.0.1:9/r/ro1/a/main/v1"}
    # the active profile's provider would win over the top-level one
    assert config["profiles"]["work"] == {"model_provider": PROVIDER, "approval_policy": "never"}
    original = tomllib.loads(USER_CONFIG)
    assert config["model_providers"]["mine"] == original["model_providers"]["mine"]
    assert {k: config[k] for k in ("model", "notify", "mcp_servers")} == \
        {k: original[k] for k in ("model", "notify", "mcp_servers")}
    assert tomllib.loads(USER_CONFIG) == original and (user / "config.toml").read_text() == USER_CONFIG


@pytest.mark.unit
def test_without_a_user_config_only_the_provider_is_written(tmp_path):
    env = {"HOME": str(tmp_path), "HARNESSRL_HOME": str(tmp_path / "hrl")}  # no ~/.codex
    with codex_home("http://h/v1", env) as home:
        assert sorted(p.name for p in home.iterdir()) == ["config.toml"]
        config = tomllib.loads((home / "config.toml").read_text())
    assert set(config) == {"model_provider", "model_providers"}


@pytest.mark.unit
def test_an_unreadable_user_config_is_a_user_error(tmp_path):
    (tmp_path / "config.toml").write_text("model = [unclosed\n")
    with pytest.raises(UserError, match="config.toml"), codex_home("http://h/v1", {"CODEX_HOME": str(tmp_path),
                                                                                 "HARNESSRL_HOME": str(tmp_path)}):
        pass


@pytest.mark.unit
def test_a_home_it_cannot_write_to_falls_back_to_the_temporary_directory(tmp_path):
    (tmp_path / "file").write_text("")
    with codex_home("http://h/v1", {"HOME": str(tmp_path), "HARNESSRL_HOME": str(tmp_path / "file" / "hrl")}) as home:
        assert tomllib.loads((home / "config.toml").read_text())["model_provider"] == PROVIDER
        assert home.name.startswith("harnessrl-codex-") and not home.is_relative_to(tmp_path)
