"""The model's reasoning carried in a `thoughtSignature`, as Gemini carries its own.

Gemini's clients do not send thought parts back (Gemini CLI drops them from its history); they
send back the `thoughtSignature` an answer's part came with, which is how Gemini keeps a turn's
reasoning across calls. The proxy's answers do the same: the first function call (else the first
text) of an answer that reasoned carries a signature holding that reasoning, and a model turn sent
back with it and without its thought parts gets the reasoning back — so the turn is the one the
model wrote, and the call that follows it extends the recorded one in the prefix index (exact
token ids, one tree). A signature the proxy did not make (Gemini's, or Gemini CLI's
`skip_thought_signature_validator`) is ignored, as is one beside thought parts sent back.
"""

from __future__ import annotations

import base64
import binascii

_MARK = b"harnessrl-thought:"


def sign(reasoning: str) -> str:
    return base64.b64encode(_MARK + reasoning.encode()).decode("ascii")


def unsign(signature: object) -> str | None:
    """The reasoning a signature of the proxy's holds; None for any other."""
    if not isinstance(signature, str) or not signature.startswith("aGFybmVzc3JsLXRob3VnaHQ6"):  # _MARK, encoded
        return None
    try:
        # (standard base64, as proto3 JSON writes bytes; a client may send it back URL-safe)
        raw = base64.b64decode(signature.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        return raw[len(_MARK):].decode() if raw.startswith(_MARK) else None
    except UnicodeDecodeError:
        return None
