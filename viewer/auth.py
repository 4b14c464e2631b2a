"""The viewer's key: `harnessrl ui --api-key KEY`, or the proxy's `--api-key` when the proxy serves
the viewer at /ui/. Recorded prompts and answers are what the viewer shows, so with a key every
page and JSON endpoint needs it (the static CSS and script, which hold no data, do not).

How a client gives it:
- a browser signs in once: the page asks for the key (a form posted to `login`), or a link
  carries it as `?key=KEY`, which is taken off the address at once (a redirect). Either sets a
  cookie — HttpOnly, SameSite=Strict, for the viewer's path only — holding an HMAC of the key, not
  the key itself: a leaked cookie opens the viewer, never the proxy's model or rollout API;
  changing the key signs every browser out.
- a script sends it as `Authorization: Bearer KEY` or `x-api-key: KEY`, as to the proxy.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qs, urlencode

COOKIE = "harnessrl_viewer"
MAX_AGE_S = 7 * 24 * 3600  # a signed-in browser stays signed in for a week


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class ViewerKey:
    def __init__(self, key: str) -> None:
        self.key = key
        self.token = hmac.new(key.encode(), b"harnessrl viewer session", hashlib.sha256).hexdigest()

    def is_key(self, given: str | None) -> bool:
        return given is not None and _same(given, self.key)

    def allows(self, headers: dict[str, str], cookies: dict[str, str]) -> bool:
        """A valid cookie, or the key in `Authorization: Bearer` or `x-api-key`."""
        if _same(cookies.get(COOKIE, ""), self.token):
            return True
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        return self.is_key(token.strip() if scheme.lower() == "bearer" else headers.get("x-api-key"))

    def cookie(self, root: str, secure: bool) -> dict:
        """`Response.set_cookie` arguments of a signed-in browser."""
        return {"key": COOKIE, "value": self.token, "max_age": MAX_AGE_S, "path": root + "/", "httponly": True,
                "samesite": "strict", "secure": secure}


def login_form(body: bytes) -> tuple[str | None, str]:
    """(key, next) of the sign-in form's urlencoded body."""
    fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=8)
    return (fields.get("key") or [None])[0], (fields.get("next") or [""])[0]


def safe_next(target: str, root: str) -> str:
    """Where to go after signing in: a path of this viewer only (never another site)."""
    ok = target.startswith(root + "/") and not target.startswith("//") and "\\" not in target
    return target if ok else root + "/"


def without_key(path: str, params: list[tuple[str, str]]) -> str:
    """The address with its `key` parameter taken off."""
    rest = [(k, v) for k, v in params if k != "key"]
    return path + ("?" + urlencode(rest) if rest else "")
