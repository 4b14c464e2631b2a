"""A Codex configuration for one command run in a rollout (`harnessrl run`, `loop --cmd`).

Codex CLI ignores `OPENAI_BASE_URL`: its built-in OpenAI provider always calls api.openai.com
(over a WebSocket first). So `run` points `CODEX_HOME` at a temporary directory whose
config.toml is the user's own (from `$CODEX_HOME` or ~/.codex) with one provider added and
selected: the rollout's base URL on the Responses API, its key read from `HARNESSRL_KEY` (the
rollout's `hrl-` key, so the user's own OpenAI key is never sent). The user's other Codex files
(auth, sessions, AGENTS.md, skills) are linked in, so the command otherwise runs as configured.
The same temporary folder holds the run's Gemini CLI home (gemini_home.py).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harnessrl.errors import UserError

PROVIDER = "harnessrl"
KEY_ENV = "HARNESSRL_KEY"


def _toml(value: object) -> str:
    """One TOML value. Tables are written inline, so the whole file is top-level `key = value`
    lines and no key can land in the wrong table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are all TOML escapes
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML value for {type(value).__name__}")


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def codex_config(user_config: dict, base_url: str) -> dict:
    """The user's Codex config with the rollout's provider selected (also in the active profile,
    which would otherwise choose its own)."""
    config = dict(user_config)
    config["model_provider"] = PROVIDER
    config["model_providers"] = {**config.get("model_providers", {}), PROVIDER: {
        "name": "harnessrl", "base_url": base_url, "env_key": KEY_ENV, "wire_api": "responses"}}
    profile = config.get("profile")
    profiles = config.get("profiles") or {}
    if isinstance(profile, str) and isinstance(profiles.get(profile), dict):
        config["profiles"] = {**profiles, profile: {**profiles[profile], "model_provider": PROVIDER}}
    return config


@contextmanager
def codex_home(base_url: str, environ: dict[str, str] | None = None) -> Iterator[Path]:
    """A temporary CODEX_HOME for the block, removed afterwards."""
    environ = os.environ if environ is None else environ
    user = Path(environ.get("CODEX_HOME") or Path(environ.get("HOME") or Path.home()) / ".codex")
    user_config: dict = {}
    if (user / "config.toml").is_file():
        try:
            user_config = tomllib.loads((user / "config.toml").read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise UserError(f"{user / 'config.toml'}: cannot read it for Codex's provider ({exc})") from None
    # not in /tmp: Codex refuses to put its helper binaries under a world-writable directory
    parent: Path | None = Path(environ.get("HARNESSRL_HOME") or Path(environ.get("HOME") or Path.home())
                               / ".harnessrl") / "codex"
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: the system's temporary directory still works (Codex only warns)
        parent = None
    with tempfile.TemporaryDirectory(prefix="harnessrl-codex-", dir=parent) as tmp:
        home = Path(tmp)
        if user.is_dir():
            for entry in user.iterdir():
                if entry.name != "config.toml":
                    (home / entry.name).symlink_to(entry.resolve())
        text = "".join(f"{_key(k)} = {_toml(v)}\n" for k, v in codex_config(user_config, base_url).items())
        (home / "config.toml").write_text("# written by harnessrl run for one rollout\n" + text)
        yield home
