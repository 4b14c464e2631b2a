# The clients of tests/test_intercept.py, run by `harnessrl run` in a network namespace with no
# route out. Each result goes to $RESULTS as name=value; the last stdout line is the outcome.
set -u
here=$(dirname "$0")
note() { echo "$1=$2" >> "$RESULTS"; }
chat() {  # chat URL KEY-HEADER MESSAGE: curl through the proxy variables, CA from CURL_CA_BUNDLE
  curl -sS -o /dev/null -w '%{http_code}' "$1" -H "$2" -H 'content-type: application/json' \
    -d "{\"model\": \"gpt-4o\", \"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"$3\"}]}"
}

"$PYTHON" "$here/openai_client.py" "hello from the openai sdk"; note openai $?
"$PYTHON" "$here/anthropic_client.py"; note anthropic $?
# without the proxy variables the same client has no way out: the call above went through mitmdump
env -u HTTPS_PROXY -u https_proxy -u HTTP_PROXY -u http_proxy \
  "$PYTHON" "$here/openai_client.py" "never sent" 2>/dev/null; note unproxied $?
note curl "$(chat https://api.openai.com/v1/chat/completions "Authorization: Bearer $TEST_CURL_KEY" 'hello from curl')"
note azure "$(chat 'https://myres.openai.azure.com/openai/deployments/tiny/chat/completions?api-version=2024-06-01' \
  "api-key: $TEST_CURL_KEY" 'hello from azure')"
note openrouter "$(chat https://openrouter.ai/api/v1/chat/completions "Authorization: Bearer $TEST_CURL_KEY" 'hello from openrouter')"
note hostsfile "$(chat https://gw.llm.internal/v1/chat/completions "Authorization: Bearer $TEST_CURL_KEY" 'hello from the hosts file')"
note files "$(curl -sS -o /dev/null -w '%{http_code}' https://api.openai.com/v1/files -H "Authorization: Bearer $TEST_CURL_KEY")"
# an hrl- key names its agent in its own rollout: the rollout's key ($HARNESSRL_KEY) with another agent name
tag=${HARNESSRL_KEY#*:}
note keyed "$(chat https://api.openai.com/v1/chat/completions "Authorization: Bearer hrl-$HARNESSRL_ROLLOUT-keyed:$tag" 'hello with a key')"
# ... and so does the username of the proxy URL (how one mitmdump serves many rollouts: loop --cmd --intercept)
note proxyuser "$(https_proxy="http://hrl-$HARNESSRL_ROLLOUT-viaproxy%3A$tag:x@${HTTPS_PROXY#*@}" \
  chat https://api.openai.com/v1/chat/completions "Authorization: Bearer $TEST_CURL_KEY" 'hello via the proxy url')"
# but never another rollout: the key's tag is its rollout's, and the harness holds no operator key
note forged "$(https_proxy="http://hrl-elsewhere-viaproxy%3A$tag:x@${HTTPS_PROXY#*@}" \
  chat https://api.openai.com/v1/chat/completions "Authorization: Bearer $TEST_CURL_KEY" 'hello from elsewhere')"
note create_other "$(curl -sS -o /dev/null -w '%{http_code}' -X POST "$HARNESSRL_PROXY/harnessrl/rollouts" \
  -H 'content-type: application/json' -H "Authorization: Bearer $HARNESSRL_KEY" -d '{"run": "other"}')"
# a host that is not an LLM API passes through untouched, credentials and all
note plain "$(curl -sS -o /dev/null -w '%{http_code}' --proxy "$HTTP_PROXY" --noproxy '' "$PLAIN_URL" \
  -H 'Authorization: Bearer not-an-llm-key')"
if command -v node >/dev/null; then node "$here/node_client.js"; note node $?; fi
echo '{"reward": 0.25}'
exit 3
