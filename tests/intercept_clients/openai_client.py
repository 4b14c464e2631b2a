"""A harness with a hard-coded api.openai.com: the openai SDK with no base URL and a real-looking
key. It drops the base-URL variables `harnessrl run` sets, as a harness that ignores them would."""

import os
import sys

import openai

for name in ("OPENAI_BASE_URL", "OPENAI_API_BASE"):
    os.environ.pop(name, None)
client = openai.OpenAI(api_key=os.environ["TEST_OPENAI_KEY"], max_retries=0, timeout=30)
reply = client.chat.completions.create(model="gpt-4o", max_tokens=5,
                                       messages=[{"role": "user", "content": sys.argv[1]}])
print("openai client:", len(reply.choices[0].message.content or ""), "characters")
