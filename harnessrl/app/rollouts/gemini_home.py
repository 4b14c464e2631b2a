"""A Gemini CLI home for one command run in a rollout (`harnessrl run`, `loop --cmd`).

Gemini CLI pointed at a base URL by `GOOGLE_GEMINI_BASE_URL` alone exits 41 ("Invalid auth
method selected."): it needs `security.auth.selectedType: gemini-api-key` in its settings. So
`run` points `GEMINI_CLI_HOME` at a temporary folder whose `.gemini/settings.json` is the user's
own (from `$GEMINI_CLI_HOME` or ~/.gemini) with that one value set; its key is then
`GEMINI_API_KEY`, the rollout's (run_cmd.rollout_env). The user's other Gemini CLI files
(credentials, GEMINI.md, history, extensions) are linked in, so the command otherwise runs as
configured. (A system settings file would outrank the user's, but Gemini CLI skips one under a
world-writable folder such as /tmp.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harnessrl.errors import UserError

HOME_ENV = "GEMINI_CLI_HOME"
AUTH = "gemini-api-key"


def strip_comments(text: str) -> str:
    """JSON with `//` and `/* */` comments (Gemini CLI's settings allow them) as plain JSON."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':  # a string, escapes and all: a // inside one (a URL) is no comment
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            i = text.find("\n", i) if "\n" in text[i:] else n
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def gemini_settings(user: dict) -> dict:
    """The user's settings with the API-key auth selected."""
    security = user.get("security") if isinstance(user.get("security"), dict) else {}
    auth = security.get("auth") if isinstance(security.get("auth"), dict) else {}
    return {**user, "security": {**security, "auth": {**auth, "selectedType": AUTH}}}


def write_gemini_home(folder: Path, environ: dict[str, str]) -> Path:
    """The Gemini CLI home of the run, made in `folder` (a temporary one of the run's)."""
    user = Path(environ.get(HOME_ENV) or environ.get("HOME") or Path.home()) / ".gemini"
    settings: dict = {}
    if (user / "settings.json").is_file():
        try:
            settings = json.loads(strip_comments((user / "settings.json").read_text()))
        except (OSError, ValueError) as exc:
            raise UserError(f"{user / 'settings.json'}: cannot read it for Gemini CLI's settings ({exc})") from None
        if not isinstance(settings, dict):
            raise UserError(f"{user / 'settings.json'}: Gemini CLI's settings must be a JSON object")
    home = folder / "gemini"
    (home / ".gemini").mkdir(parents=True)
    if user.is_dir():
        for entry in user.iterdir():
            if entry.name != "settings.json":
                (home / ".gemini" / entry.name).symlink_to(entry.resolve())
    (home / ".gemini" / "settings.json").write_text(json.dumps(gemini_settings(settings), indent=2) + "\n")
    os.chmod(home / ".gemini" / "settings.json", 0o600)
    return home
