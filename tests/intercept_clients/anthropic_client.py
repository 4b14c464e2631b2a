"""The anthropic SDK with no base URL and a real-looking key (api.anthropic.com hard-coded)."""

import os

import anthropic

os.environ.pop("ANTHROPIC_BASE_URL", None)
client = anthropic.Anthropic(api_key=os.environ["TEST_ANTHROPIC_KEY"], max_retries=0, timeout=30)
reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=5,
                               messages=[{"role": "user", "content": "hello from the anthropic sdk"}])
print("anthropic client:", reply.stop_reason)
