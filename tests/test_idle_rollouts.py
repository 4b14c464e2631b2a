"""Rollouts named only by URL path, with no outcome reported (issue 44 §5).

A harness pointed at `/r/<rollout>/a/<agent>/v1` creates its rollout on first use; nobody finishes
it, so it stayed `running` forever, and compile left it out for want of an outcome while a
newcomer saw 0 samples and no hint why. Now such a rollout idle past `--rollout-idle` is finished
(`finished_by: idle`), still takes its outcome (`harnessrl reward`), and compile says how many
rollouts it left out, which, and how to give them one. A real proxy over the vLLM stand-in,
driven by the OpenAI SDK; the sweep's rule itself on SQLite and PostgreSQL."""

from __future__ import annotations

import time

import httpx
import openai
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select
from test_compiler_pipeline import cli_in_process

from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.proxy.rollouts.store import Rollouts
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.records import Call, Rollout

MSG = [{"role": "user", "content": "Say hi."}]


def _chat(url: str, rollout: str | None):
    base = f"{url}/r/{rollout}/a/main/v1" if rollout else f"{url}/v1"
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    return client.chat.completions.create(model="m", messages=MSG, max_tokens=4)


def _rollout(url: str, rid: str) -> dict:
    return httpx.get(f"{url}/harnessrl/rollouts/{rid}").json()


def _wait_finished(url: str, rid: str, limit_s: float = 30.0) -> dict:
    end = time.monotonic() + limit_s
    while (got := _rollout(url, rid))["status"] == "running" and time.monotonic() < end:
        time.sleep(0.1)
    return got


def test_a_path_named_rollout_idle_past_the_limit_is_finished_and_still_takes_its_outcome(
        upstream, tokenizer_dir, tmp_path, monkeypatch, capsys):
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0, rollout_idle_s=0.5)) as proxy:
        owned = httpx.post(f"{proxy.url}/harnessrl/rollouts", json={"id": "owned"}).json()["id"]
        _chat(proxy.url, "owned")
        _chat(proxy.url, None)  # the unassigned rollout
        _chat(proxy.url, "by-path")
        _chat(proxy.url, "graded-later")
        got = _wait_finished(proxy.url, "by-path")
        assert got["status"] == "finished" and got["finished_at"] is not None
        assert got["metadata"] == {"created_by": "first_use", "finished_by": "idle"}
        # it takes no more calls, as any finished rollout; the API-created and unassigned ones still run
        with pytest.raises(openai.APIStatusError) as late:
            _chat(proxy.url, "by-path")
        assert late.value.status_code == 410 and "--rollout-idle" in late.value.message
        assert _rollout(proxy.url, owned)["status"] == "running"
        assert _rollout(proxy.url, "unassigned")["status"] == "running"
        # before its outcome, compile leaves it out and says why and what to do
        code, out, _ = cli_in_process(monkeypatch, capsys, "compile", "--db", db, "--out", str(tmp_path / "c0"),
                                      "--rollouts", "by-path", "--tokenizer", str(tokenizer_dir))
        assert code == 0 and "no samples: 1 rollouts had no outcome reward" in out
        assert "(by-path)" in out and "harnessrl reward ROLLOUT VALUE" in out and "--missing-outcome zero" in out
        # its outcome is still taken (the proxy, not its owner, finished it); an owner's finish is final
        code, _, err = cli_in_process(monkeypatch, capsys, "reward", "by-path", "1", "--proxy", proxy.url)
        assert code == 0, err
        httpx.post(f"{proxy.url}/harnessrl/rollouts/{owned}/finish").raise_for_status()
        refused = httpx.post(f"{proxy.url}/harnessrl/rollouts/{owned}/reward", json={"value": 1})
        assert refused.status_code == 409 and "idle" in refused.json()["error"]["message"]
        assert [w["value"] for w in _rollout(proxy.url, "by-path")["rewards"]] == [1.0]
    # with the proxy gone, an outcome goes into the DB itself, by the same rules
    code, _, err = cli_in_process(monkeypatch, capsys, "reward", "graded-later", "0.5", "--db", db)
    assert code == 0, err
    code, _, err = cli_in_process(monkeypatch, capsys, "reward", owned, "1", "--db", db)
    assert code == 2 and "is finished" in err and err.strip().count("\n") == 0
    code, _, err = cli_in_process(monkeypatch, capsys, "reward", "x", "1", "--db", str(tmp_path / "nosuch.db"))
    assert code == 2 and "no records DB at" in err
    code, out, _ = cli_in_process(monkeypatch, capsys, "compile", "--db", db, "--out", str(tmp_path / "c1"),
                                  "--rollouts", "by-path,graded-later", "--tokenizer", str(tokenizer_dir))
    assert code == 0 and "had no outcome reward" not in out
    assert pq.read_table(tmp_path / "c1" / "samples.parquet").num_rows == 2


def test_the_sweep_finishes_only_first_use_rollouts_idle_since_their_last_call_or_reward(db_target):
    engine, Session = open_db(db_target)
    store = Rollouts(Session)
    store.status("quiet", create=True)
    store.status("busy", create=True)
    store.create(None, None, None, None, "owned")
    with Session.begin() as s:
        for r in s.scalars(select(Rollout)):
            r.created_at = 1000.0
        s.add(Call(id="c1", rollout_id="busy", seq=0, endpoint="chat", request={}, status="ok", created_at=1500.0))
    assert store.finish_idle(600, now=1500.0) == []  # created 500 s ago: none idle yet
    assert store.finish_idle(600, now=1700.0) == ["quiet"]  # busy's call was 200 s ago; owned is its owner's
    assert store.finish_idle(600, now=2200.0) == ["busy"]
    store.outcome("busy", 0.5, "outcome", None)  # taken after an idle finish
    with Session() as s:
        got = {r.id: (r.status, r.finished_at, r.meta) for r in s.scalars(select(Rollout))}
    assert got["quiet"] == ("finished", 1700.0, {"created_by": "first_use", "finished_by": "idle"})
    assert got["busy"][:2] == ("finished", 2200.0) and got["owned"] == ("running", None, None)
    engine.dispose()


def test_rollout_idle_must_not_be_negative():
    with pytest.raises(UserError, match="--rollout-idle must be >= 0"):
        ProxyConfig(db="x.db", upstream="http://127.0.0.1:9", rollout_idle_s=-1).check()
