"""How a call reaches a model (the `Route`s of `protocol.py`): forwarded as it is (`passthrough`),
translated to a text-only dialect (`text`), or as prompt token ids the proxy builds (`tokens`),
with what those need: the token-backend protocol, chat fields a template cannot say, hermes tool
calls."""
