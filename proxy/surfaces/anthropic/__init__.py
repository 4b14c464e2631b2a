"""The Anthropic Messages API: request translation, tools (client, deferred, hosted) and the
wire (messages, stream events, Anthropic-shaped errors)."""
