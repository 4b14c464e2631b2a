"""Black-box tracing: `harnessrl run -- CMD` with mitmproxy interception, in a network namespace
with no route out (only loopback up), so nothing a client sends can leave the machine.

One session (tests/intercept_session.py, run under `unshare -rn`) drives the real clients of
tests/intercept_clients through `harnessrl run` and `harnessrl intercept --only-llm`; the tests
read what it recorded. mitmproxy comes from its own venv (.venv-mitm, made by scripts/install.sh,
or $HARNESSRL_MITMDUMP); without it they fail (the README's install makes it); without network
namespaces they skip saying why.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from harnessrl.db import open_db
from harnessrl.records import Call, Reward, Rollout

ROOT = Path(__file__).resolve().parents[1]
ADDON = ROOT / "harnessrl" / "intercept_addon.py"


def _mitmdump() -> str | None:
    for candidate in (os.environ.get("HARNESSRL_MITMDUMP"), ROOT / ".venv-mitm" / "bin" / "mitmdump"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return None


def _netns_reason() -> str | None:
    """Why a network namespace cannot be used here (None: it can)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2) for a network namespace"
    probe = subprocess.run(["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"network namespaces unavailable here (unshare -rn: {probe.stderr.strip()[:120]})"
    return None


@pytest.fixture(scope="module")
def session(tiny_model_dir, tmp_path_factory) -> dict:
    if (reason := _netns_reason()) is not None:
        pytest.skip(reason)
    if (mitmdump := _mitmdump()) is None:  # the README's install makes it: its absence is a failure, not a skip
        pytest.fail("mitmproxy not installed: run scripts/install.sh (it makes .venv-mitm) or set HARNESSRL_MITMDUMP")
    out = tmp_path_factory.mktemp("intercept")
    env = {**os.environ, "HARNESSRL_MITMDUMP": mitmdump}
    proc = subprocess.run(["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable,
                           str(ROOT / "tests" / "intercept_session.py"), str(out), str(tiny_model_dir)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    results["out"] = out
    return results


def _calls(session, run: str) -> tuple[Rollout, list[Call]]:
    _, Session = open_db(str(session["out"] / "db" / "runs.db"))
    with Session() as s:
        ro = s.scalars(select(Rollout).where(Rollout.run == run)).one()
        return ro, list(s.scalars(select(Call).where(Call.rollout_id == ro.id).order_by(Call.seq)))


def _message(call: Call) -> str:
    return call.request["messages"][-1]["content"]


def test_run_creates_the_rollout_and_keeps_the_command_exit_code_and_outcome(session):
    assert session["run_rc"] == 3, session["run_stderr"][-2000:]  # clients.sh exits 3
    ro, _ = _calls(session, "ns")
    assert f"rollout {ro.id}" in session["run_stderr"]
    assert ro.task_id == "t1" and ro.status == "finished"
    _, Session = open_db(str(session["out"] / "db" / "runs.db"))
    with Session() as s:
        rewards = list(s.scalars(select(Reward).where(Reward.rollout_id == ro.id)))
    assert [(r.kind, r.value) for r in rewards] == [("outcome", 0.25)]  # the last stdout line
    assert session["run_stdout"].rstrip().endswith('{"reward": 0.25}')  # the command's stdout passed on


def test_openai_sdk_without_base_url_is_recorded_with_token_ids(session):
    assert session["clients"]["openai"] == "0", session["run_stdout"][-2000:]
    _, calls = _calls(session, "ns")
    call = next(c for c in calls if _message(c) == "hello from the openai sdk")
    assert call.status == "ok" and call.agent == "main" and call.endpoint == "chat"
    assert call.prompt_ids and call.completion_ids
    # the same client without the proxy variables cannot reach anything: the call went through mitmdump
    assert session["clients"]["unproxied"] != "0"
    assert not any(_message(c) == "never sent" for c in calls)


def test_curl_azure_openrouter_and_hosts_file_are_mapped_to_chat_completions(session):
    clients = session["clients"]
    assert {k: clients[k] for k in ("curl", "azure", "openrouter", "hostsfile")} == dict.fromkeys(
        ("curl", "azure", "openrouter", "hostsfile"), "200")
    _, calls = _calls(session, "ns")
    recorded = {_message(c): c for c in calls}
    for text in ("hello from curl", "hello from azure", "hello from openrouter", "hello from the hosts file"):
        assert recorded[text].status == "ok" and recorded[text].completion_ids
    # an LLM host's path the proxy has no endpoint for is answered here, never sent on with the key
    assert clients["files"] == "404"


def test_node_client_trusts_the_ca_through_node_extra_ca_certs(session):
    if "node" not in session["clients"]:
        pytest.skip("node is not installed: the Node client was not run")
    assert session["clients"]["node"] == "0", session["run_stderr"][-2000:]
    _, calls = _calls(session, "ns")
    assert any(_message(c) == "hello from node" and c.completion_ids for c in calls)


def test_an_hrl_key_or_proxy_username_names_its_agent_in_its_own_rollout_only(session):
    clients = session["clients"]
    assert clients["keyed"] == "200" and clients["proxyuser"] == "200"
    # the rollout's key cannot pass for another rollout, nor create one (issue 42: tests/test_rollout_keys.py)
    assert clients["forged"] == "401" and clients["create_other"] == "403"
    _, calls = _calls(session, "ns")
    assert [(c.agent, _message(c)) for c in calls if c.agent in ("keyed", "viaproxy")] == [
        ("keyed", "hello with a key"), ("viaproxy", "hello via the proxy url")]
    assert not any(_message(c) == "hello from elsewhere" for c in calls)


def test_no_client_key_reaches_the_db_or_the_logs(session):
    files = [p for d in ("db", "home") for p in (session["out"] / d).rglob("*") if p.is_file()]
    assert any(p.name == "runs.db" for p in files) and any(p.name == "mitmdump.log" for p in files)
    texts = [p.read_bytes() for p in files] + [session["run_stdout"].encode(), session["run_stderr"].encode()]
    for name, key in session["keys"].items():
        assert not any(key.encode() in t for t in texts), f"{name} was stored or logged"


def test_the_ca_directory_is_owner_only(session):
    ca = session["out"] / "home" / "mitmproxy"
    assert ca.stat().st_mode & 0o777 == 0o700
    assert (ca / "mitmproxy-ca.pem").stat().st_mode & 0o077 == 0  # the CA's private key


def test_other_hosts_pass_through_untouched(session):
    assert session["clients"]["plain"] == "200"
    assert session["plain_seen"][0] == {"path": "/plain", "authorization": "Bearer not-an-llm-key"}


def test_only_llm_refuses_other_hosts_with_403(session):
    assert session["refused"] == {"http": "403", "connect": "403"}
    assert len(session["plain_seen"]) == 1  # the refused request never reached the server
    banner = session["intercept_banner"]
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
                 "CURL_CA_BUNDLE"):
        assert f"export {name}=" in banner
    assert "CA certificate: " in banner and "mitmproxy-ca-cert.pem" in banner


def test_anthropic_sdk_without_base_url_is_recorded_with_token_ids(session):
    assert session["clients"]["anthropic"] == "0"
    _, calls = _calls(session, "ns")
    call = next(c for c in calls if "hello from the anthropic sdk" in json.dumps(c.request))
    assert call.status == "ok" and call.prompt_ids and call.completion_ids


@pytest.mark.unit
def test_the_addon_imports_only_the_standard_library_and_mitmproxy():
    tree = ast.parse(ADDON.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))  # no relative imports
    tops = {name.split(".")[0] for name in names}
    assert "mitmproxy" in tops  # the walk found the imports
    assert tops - {"mitmproxy", "__future__"} <= set(sys.stdlib_module_names), tops


def _rewrites(requests: list) -> list[dict]:
    """What the addon makes of each (method, url, headers), in mitmproxy's own environment."""
    if (mitmdump := _mitmdump()) is None:
        pytest.fail("mitmproxy not installed: run scripts/install.sh (it makes .venv-mitm) or set HARNESSRL_MITMDUMP")
    python = Path(mitmdump).with_name("python")
    proc = subprocess.run([str(python), str(ROOT / "tests" / "intercept_addon_rewrites.py"), str(ADDON),
                           json.dumps(requests)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


GEMINI = "https://generativelanguage.googleapis.com"
GEMINI_KEY = "AIzaSyHrlSecretGemini9xkLmQp2RvN9wEaYc4u"


@pytest.mark.unit
def test_gemini_api_calls_go_to_the_proxys_gemini_surface_without_the_key():
    key = {"x-goog-api-key": GEMINI_KEY}
    got = _rewrites([
        ["POST", f"{GEMINI}/v1beta/models/gemini-2.5-pro:generateContent", key],
        ["POST", f"{GEMINI}/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse&key={GEMINI_KEY}", {}],
        ["POST", f"{GEMINI}/v1/models/gemini-2.5-pro:countTokens", key],
        ["GET", f"{GEMINI}/v1beta/models?pageSize=50", key],
        ["GET", f"{GEMINI}/v1beta/models/gemini-2.5-pro", key],
        ["POST", f"{GEMINI}/upload/v1beta/files", key],  # no endpoint of the proxy: answered here
        ["POST", "https://api.openai.com/v1/chat/completions", {"authorization": "Bearer sk-x"}]])
    proxy = "http://127.0.0.1:8123"
    assert [g.get("url") for g in got] == [
        f"{proxy}/v1beta/models/gemini-2.5-pro:generateContent",
        f"{proxy}/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",  # the stream's format kept
        f"{proxy}/v1beta/models/gemini-2.5-pro:countTokens",
        f"{proxy}/v1beta/models?pageSize=50", f"{proxy}/v1beta/models/gemini-2.5-pro",
        None, f"{proxy}/v1/chat/completions"]
    assert got[5]["status"] == 404 and "not an endpoint the recording proxy serves" in got[5]["body"]
    for sent in got[:5]:  # the Gemini key never goes on: the proxy's key in its place
        assert GEMINI_KEY not in json.dumps(sent)
        assert {k.lower(): v for k, v in sent["headers"].items()}.get("authorization") == "Bearer hrl-proxykey"
