"""Issue 27: a rollout in which the harness was refused a call is left out of its group by compile
(`--on-call-error drop`, the default), so it neither trains nor shifts the other members'
advantages; `keep` is the old behaviour. The two cases found with real harnesses, recorded
through the real proxy (vLLM stand-in upstream, openai SDK on a socket, SQLite file)."""

from __future__ import annotations

import math

import httpx
import openai
import pyarrow.parquet as pq
import pytest

from harnessrl.compiler.pipeline import CompileOptions, Compiler
from harnessrl.proxy.server import ProxyConfig, run_proxy
from test_compiler_pipeline import cli_in_process

MSG = [{"role": "user", "content": "What is the capital of the river country?"}]
REFUSED = [{"role": "robot", "content": "x"}]  # a role the proxy refuses (400) before the model runs


def _call(base_url: str, messages: list[dict]) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        client.chat.completions.create(model="m", messages=messages, max_tokens=6)
    except openai.BadRequestError:
        assert messages is REFUSED


def _record(upstream: str, db: str, rollouts: list[tuple[str, float, list[tuple[str, list[dict]]]]]) -> None:
    """Each rollout (group "g"): its calls (agent, messages) in order, then its reported outcome."""
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        for rid, outcome, calls in rollouts:
            api = f"{proxy.url}/harnessrl/rollouts"
            httpx.post(api, json={"id": rid, "task_id": "t", "group_id": "g"}).raise_for_status()
            for agent, messages in calls:
                _call(f"{proxy.url}/r/{rid}/a/{agent}/v1", messages)
            httpx.post(f"{api}/{rid}/reward", json={"value": outcome}).raise_for_status()
            httpx.post(f"{api}/{rid}/finish").raise_for_status()


def _compile(db: str, out, tokenizer_dir, **kw) -> tuple[dict, dict[str, list[float]]]:
    stats = Compiler(db, CompileOptions(out=out, tokenizer=str(tokenizer_dir), train_agents="all", jobs=1,
                                        **kw)).run()
    adv: dict[str, list[float]] = {}
    for s in pq.read_table(out / "samples.parquet").to_pylist():
        adv.setdefault(s["rollout_id"], []).extend(a for a, m in zip(s["advantage"], s["loss_mask"]) if m)
    return stats, adv


def test_two_refused_rollouts_no_longer_lift_the_third(upstream, tokenizer_dir, tmp_path):
    db = str(tmp_path / "runs.db")
    _record(upstream, db, [("ok", 1.0, [("main", MSG)]), ("ref1", 0.0, [("main", REFUSED)]),
                           ("ref2", 0.0, [("main", REFUSED)])])
    stats, adv = _compile(db, tmp_path / "drop", tokenizer_dir)
    t = stats["totals"]
    # alone in its group: no baseline, advantage 0 under the default --singleton zero
    assert set(adv) == {"ok"} and set(adv["ok"]) == {0.0}
    assert (t["dropped_call_error"], t["call_errors"], t["singleton_groups"]) == (2, 2, 1)
    assert [stats["rollouts"][r].get("dropped_call_error", 0) for r in ("ok", "ref1", "ref2")] == [0, 1, 1]
    assert stats["options"]["on_call_error"] == "drop"

    stats, adv = _compile(db, tmp_path / "keep", tokenizer_dir, on_call_error="keep")
    # as before: outcomes (1, 0, 0) → (1 − ⅓) / sample std √⅓ = +1.155 on the one rollout that ran
    expected = (1 - 1 / 3) / (math.sqrt(1 / 3) + 1e-6)
    assert set(adv) == {"ok"} and adv["ok"] == pytest.approx([expected] * len(adv["ok"]))
    assert round(expected, 3) == 1.155
    assert (stats["totals"]["dropped_call_error"], stats["totals"]["singleton_groups"]) == (0, 0)


def test_a_refused_main_call_beside_an_ok_side_call_trains_nothing(upstream, tokenizer_dir, tmp_path, monkeypatch,
                                                                    capsys):
    db = str(tmp_path / "runs.db")
    _record(upstream, db, [("broken", 0.0, [("main", REFUSED), ("side", MSG)]), ("good", 1.0, [("main", MSG)])])
    stats, adv = _compile(db, tmp_path / "drop", tokenizer_dir)
    assert set(adv) == {"good"} and set(adv["good"]) == {0.0}
    assert stats["totals"]["dropped_call_error"] == 1 and stats["rollouts"]["broken"]["call_errors"] == 1

    stats, adv = _compile(db, tmp_path / "keep", tokenizer_dir, on_call_error="keep")
    # as before: the side call trains at (0 − ½) / std(0, 1) = −0.707, the good rollout at +0.707
    half = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv["broken"] == pytest.approx([-half] * len(adv["broken"]))
    assert adv["good"] == pytest.approx([half] * len(adv["good"]))
    assert stats["totals"]["dropped_call_error"] == 0 and stats["totals"]["call_errors"] == 1

    # the command line: the default said on the console, `keep` taken, a wrong value refused
    out = tmp_path / "cli"
    code, stdout, _ = cli_in_process(monkeypatch, capsys, "compile", "--db", db, "--out", str(out), "--tokenizer",
                                     str(tokenizer_dir), "--train-agents", "all")
    assert code == 0 and "1 rollouts had a call refused or failed: left out" in stdout
    code, stdout, _ = cli_in_process(monkeypatch, capsys, "compile", "--db", db, "--out", str(out), "--tokenizer",
                                     str(tokenizer_dir), "--on-call-error", "keep")
    assert code == 0 and "kept (--on-call-error keep)" in stdout
    code, _, stderr = cli_in_process(monkeypatch, capsys, "compile", "--db", db, "--on-call-error", "ignore")
    assert code == 2 and "--on-call-error 'ignore'" in stderr
    # inspect: the rollout's error count, each call's surface, and the refused call beside the tree
    code, stdout, _ = cli_in_process(monkeypatch, capsys, "inspect", "--db", db, "--rollout", "broken", "--tokenizer",
                                     str(tokenizer_dir))
    assert code == 0 and "errors=1" in stdout and "calls in no tree" in stdout
    assert "seq=0 chat error: 400 invalid_request_error" in stdout and "seq=1 chat prompt=" in stdout


def test_a_call_refused_because_its_rollout_was_finished_is_not_a_call_error(upstream, tokenizer_dir, tmp_path):
    """A call refused because its rollout was finished adds nothing to that rollout, so it is
    compiled as it was when it finished."""
    db = str(tmp_path / "runs.db")
    _record(upstream, db, [("a", 1.0, [("main", MSG)]), ("b", 0.0, [("main", MSG)])])
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0)) as proxy:
        late = openai.OpenAI(base_url=f"{proxy.url}/r/a/a/main/v1", api_key="unused")
        with pytest.raises(openai.APIStatusError):
            late.chat.completions.create(model="m", messages=MSG, max_tokens=6)
    stats, adv = _compile(db, tmp_path / "drop", tokenizer_dir)
    assert set(adv) == {"a", "b"} and stats["totals"]["call_errors"] == 0
