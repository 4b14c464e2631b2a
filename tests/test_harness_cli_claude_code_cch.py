"""The real Claude Code (harnesses.lock) with its base URL taken for api.anthropic.com, as under
interception: it then writes a fresh `cch=<hash>;` into its system prompt on every call. Through
the proxy in prefix mode (over the vLLM stand-in) the main loop's turns still extend one another
— the proxy holds the session's first hash (docs/methods.md §2) — and, with no agent named, the
main loop is one agent (its name ignores the hash) apart from any title side call: compile gives
the main loop one sample."""

from __future__ import annotations

import os
import subprocess

import harness_cli as hc
import pytest

from harnessrl.proxy.server import ProxyConfig, run_proxy
from surface_fixtures import Target, assert_extends, calls, compile_rollouts

pytestmark = pytest.mark.harness


def test_claude_code_with_cch_merges_its_main_loop(upstream, tokenizer_dir, tmp_path):
    hc.require("claude-code")
    db = str(tmp_path / "r.db")
    (tmp_path / "home").mkdir()
    cfg = ProxyConfig(db=db, upstream=upstream, prefix=True, tokenizer=str(tokenizer_dir), port=0)
    with run_proxy(cfg) as proxy:
        env = {**os.environ, "HOME": str(tmp_path / "home"), "ANTHROPIC_BASE_URL": proxy.url,
               "ANTHROPIC_API_KEY": hc.KEYS["ANTHROPIC_API_KEY"], "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               # what makes Claude Code send cch= (it does for api.anthropic.com), and the rollout
               "_CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL": "true",
               "ANTHROPIC_CUSTOM_HEADERS": "x-harnessrl-rollout: cc"}
        done = subprocess.run([str(hc.program("claude-code")), "-p", hc.TASK, "--allowedTools", "Bash"], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = calls(db, "cc")
    assert rows and all(r.status == "ok" for r in rows)
    # the main loop has tools; a title side call (made unless nonessential traffic is off) has none
    main = [r for r in rows if r.request.get("tools")]
    side = [r for r in rows if not r.request.get("tools")]
    assert len(main) >= 2 and len({r.agent for r in main}) == 1 and main[0].agent not in {r.agent for r in side}
    # the harness sent a new hash each call; the model got the first one each time
    hashes = [r.request["harnessrl_surface"]["body"]["system"][0]["text"].rpartition("cch=")[2] for r in main]
    assert len(set(hashes)) == len(main)
    for earlier, later in zip(main, main[1:]):
        assert later.request["harnessrl_held"]["spans"] == [
            {"message": 0, "sent": f"cch={hashes[0]}", "harness": f"cch={hashes[main.index(later)]}"}]
        assert_extends(earlier, later)
    totals = compile_rollouts(Target("standin", proxy.url, db, str(tokenizer_dir)), ("cc",), tmp_path / "out")
    assert (totals["samples"], totals["merges"]) == (1 + len(side), len(main) - 1) and totals["token_saving"] > 2
