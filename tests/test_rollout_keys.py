"""Keys scoped to a rollout (issue 42 §1, §6): the table of docs/proxy.md "Keys", one test per
row, on a real proxy (a real socket, the vLLM stand-in upstream) with the real OpenAI SDK and
httpx. A rollout's key `hrl-<rollout>-<agent>:rk_…` grants its own model calls and a few routes
of its own rollout; everything else is the operator's. Before: `run`/`loop` gave the harness
`hrl-<id>-main:KEY`, the operator key itself, which the proxy took for everything."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import httpx
import openai
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from harnessrl.app.rollouts.command import RunOptions
from harnessrl.app.rollouts.run_cmd import owned_proxy, run_command
from harnessrl.client import HarnessRL, HarnessRLError
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.viewer.app import create_viewer, standalone

sys.path.insert(0, str(Path(__file__).parent))
from viewer_fixtures import serve  # noqa: E402

KEY = "operator-sekret"
MSGS = [{"role": "user", "content": "Hi"}]
OP = {"Authorization": f"Bearer {KEY}"}
DB: list[str] = []  # the module proxy's records DB


@pytest.fixture(scope="module")
def proxy(upstream, tmp_path_factory):
    db = str(tmp_path_factory.mktemp("keys") / "runs.db")
    DB[:] = [db]
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0, api_key=KEY)) as p, \
            HarnessRL(p.url, api_key=KEY) as op, httpx.Client(base_url=p.url, timeout=30) as http:
        yield p.url, op, http


def _rollouts(op: HarnessRL, outcome_by: str = "harness"):
    """Two group-mates of one task, each with one recorded call (made with its own key)."""
    ros = [op.create_rollout(task_id="t", group_id="g", outcome_by=outcome_by) for _ in range(2)]
    calls = [_chat(ro.base_url("main"), ro.api_key("main")) for ro in ros]
    return ros, calls


def _chat(base_url: str, key: str, **kw) -> str:
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, **kw)
    raw = client.chat.completions.with_raw_response.create(model="m", messages=MSGS, max_tokens=2)
    return raw.headers["x-harnessrl-call"]


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _refused(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code, r.text


def _refused_count(http: httpx.Client, status: int) -> float:
    text = http.get("/metrics", headers=OP).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("harnessrl_proxy_refused_total{") and f'http_status="{status}"' in line)


def test_the_minted_key_is_the_rollouts_and_not_the_operators(proxy):
    _, op, _ = proxy
    ro = op.create_rollout(task_id="t")
    key = ro.api_key("main")
    assert key.startswith(f"hrl-{ro.id}-main:rk_") and KEY not in key
    assert ro.api_key("worker").split(":")[1] == key.split(":")[1]  # any agent of the rollout: one tag


def test_row_model_call_own_rollout_is_served_and_recorded_there(proxy):
    url, op, _ = proxy
    ro = op.create_rollout(task_id="t")
    call = _chat(ro.base_url("main"), ro.api_key("main"))
    plain = _chat(url + "/v1", ro.api_key("solver"))  # no identity in the path: the key's
    got = op.get_rollout(ro.id)
    assert {c["id"]: c["agent"] for c in got["calls"]} == {call: "main", plain: "solver"}


def test_row_base_url_carries_the_key_for_harnesses_that_send_their_own(proxy):
    """`ro.base_url` (and so OPENAI_BASE_URL, loop --cmd's {base_url}) holds the rollout's key: a
    harness that sets only the URL and sends "unused" or a vendor key still makes its calls."""
    _, op, http = proxy
    (a, b), _ = _rollouts(op)
    assert a.base_url("main").split("/k/")[1].startswith(a.api_key("main").split(":")[1])
    call = _chat(a.base_url("main"), "unused")
    assert call in [c["id"] for c in op.get_rollout(a.id)["calls"]]
    assert http.get(a.base_url("main") + "/models", headers={"x-api-key": "sk-vendor"}).status_code == 200
    r = http.post(f"/k/{a.api_key('m').split(':')[1]}/r/{b.id}/a/main/v1/chat/completions",
                  json={"model": "m", "messages": MSGS, "max_tokens": 2})
    _refused(r, 401, "invalid_api_key")  # a's tag in b's URL: no key at all


def test_row_model_call_other_rollout_is_refused_403_and_counted(proxy):
    url, op, http = proxy
    (a, b), _ = _rollouts(op)
    before = _refused_count(http, 403)
    with pytest.raises(openai.PermissionDeniedError) as refused:  # the group-mate's base URL, a's key
        _chat(url + f"/r/{b.id}/a/main/v1", a.api_key("main"))
    assert refused.value.body["code"] == "rollout_key_scope"
    with pytest.raises(openai.PermissionDeniedError):  # the group-mate named in a header
        _chat(url + "/v1", a.api_key("main"), default_headers={"X-HarnessRL-Rollout": b.id})
    # Anthropic's surface and header alike, answered in Anthropic's error shape
    r = http.post(f"/r/{b.id}/a/main/v1/messages", headers={"x-api-key": a.api_key("main")},
                  json={"model": "m", "messages": MSGS, "max_tokens": 2})
    assert r.status_code == 403 and r.json()["type"] == "error", r.text
    assert _refused_count(http, 403) == before + 3
    assert len(op.get_rollout(b.id)["calls"]) == 1  # nothing written into b


def test_row_stored_responses_and_websocket_of_another_rollout_are_refused(proxy):
    url, op, http = proxy
    (a, b), _ = _rollouts(op)
    r = http.get(f"/r/{b.id}/a/main/v1/responses/resp_" + "0" * 32, headers=_bearer(a.api_key("main")))
    _refused(r, 403, "rollout_key_scope")
    own = http.get(f"/r/{a.id}/a/main/v1/responses/resp_" + "0" * 32, headers=_bearer(a.api_key("main")))
    _refused(own, 404, "response_not_found")  # its own rollout: looked up (none such)
    ws = url.replace("http://", "ws://") + f"/r/{b.id}/a/main/v1/responses"
    with pytest.raises(InvalidStatus) as refused:
        with connect(ws, additional_headers=_bearer(a.api_key("main"))):
            pass
    assert refused.value.response.status_code == 403
    with connect(url.replace("http://", "ws://") + f"/r/{a.id}/a/main/v1/responses",
                 additional_headers=_bearer(a.api_key("main"))):
        pass  # its own: accepted


def test_row_models_count_tokens_and_probes_take_a_rollout_key(proxy):
    _, op, http = proxy
    ro = op.create_rollout(task_id="t")
    key = _bearer(ro.api_key("main"))
    assert http.get(f"/r/{ro.id}/a/main/v1/models", headers=key).status_code == 200
    assert http.get("/v1/models", headers=key).status_code == 200
    counted = http.post("/v1/messages/count_tokens", headers=key, json={"model": "m", "messages": MSGS})
    assert counted.status_code not in (401, 403), counted.text  # (501 here: the stand-in has no tokenizer)
    assert http.get("/health").status_code == 200 and http.get("/ready", headers=key).status_code in (200, 503)


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/harnessrl/rollouts", None),
    ("POST", "/harnessrl/rollouts", {"task_id": "t"}),
    ("POST", "/harnessrl/weights", {"path": "/nowhere"}),
    ("GET", "/metrics", None),
], ids=["list", "create", "weights", "metrics"])
def test_row_operator_routes_refuse_a_rollout_key(proxy, method, path, body):
    _, op, http = proxy
    ro = op.create_rollout(task_id="t")
    r = http.request(method, path, json=body, headers=_bearer(ro.api_key("main")))
    _refused(r, 403, "operator_key_required")
    assert http.request(method, path, json=body, headers=OP).status_code != 403  # the operator's


def test_row_read_a_rollout_own_yes_other_no(proxy):
    _, op, http = proxy
    (a, b), _ = _rollouts(op)
    assert http.get(f"/harnessrl/rollouts/{a.id}", headers=_bearer(a.api_key("x"))).json()["id"] == a.id
    _refused(http.get(f"/harnessrl/rollouts/{b.id}", headers=_bearer(a.api_key("x"))), 403, "rollout_key_scope")


def test_row_outcome_own_when_the_harness_reports_it_other_never(proxy):
    _, op, http = proxy
    (a, b), _ = _rollouts(op)
    own = http.post(f"/harnessrl/rollouts/{a.id}/reward", json={"value": 1.0}, headers=_bearer(a.api_key("main")))
    assert own.status_code == 200, own.text
    other = http.post(f"/harnessrl/rollouts/{b.id}/reward", json={"value": 0.0}, headers=_bearer(a.api_key("main")))
    _refused(other, 403, "rollout_key_scope")
    assert [w["value"] for w in op.get_rollout(b.id)["rewards"]] == []


def test_row_outcome_of_a_scorer_rollout_is_refused_to_its_own_key(proxy):
    _, op, http = proxy
    (s, _), _ = _rollouts(op, outcome_by="scorer")
    r = http.post(f"/harnessrl/rollouts/{s.id}/reward", json={"value": 1.0}, headers=_bearer(s.api_key("main")))
    _refused(r, 403, "outcome_by_scorer")
    assert "outcome_by: scorer" in r.json()["error"]["message"]
    op.reward(s.id, 0.25)  # the scorer (the operator's key) sets it
    assert [(w["kind"], w["value"]) for w in op.get_rollout(s.id)["rewards"]] == [("outcome", 0.25)]
    assert op.get_rollout(s.id)["metadata"] == {"outcome_by": "scorer"}


def test_row_process_rewards_own_calls_only_and_not_under_a_scorer(proxy):
    _, op, http = proxy
    (a, b), (call_a, call_b) = _rollouts(op)
    key = _bearer(a.api_key("main"))
    assert http.post(f"/harnessrl/calls/{call_a}/reward", json={"value": 0.5}, headers=key).status_code == 200
    _refused(http.post(f"/harnessrl/calls/{call_b}/reward", json={"value": 0.5}, headers=key), 403,
             "rollout_key_scope")
    (s, _), (call_s, _) = _rollouts(op, outcome_by="scorer")
    _refused(http.post(f"/harnessrl/calls/{call_s}/reward", json={"value": 1}, headers=_bearer(s.api_key("m"))),
             403, "outcome_by_scorer")


def test_row_finish_own_plainly_never_failed_never_another_never_a_scorers(proxy):
    _, op, http = proxy
    (a, b), _ = _rollouts(op)
    key = _bearer(a.api_key("main"))
    _refused(http.post(f"/harnessrl/rollouts/{b.id}/finish", json={}, headers=key), 403, "rollout_key_scope")
    _refused(http.post(f"/harnessrl/rollouts/{a.id}/finish", json={"error": "x"}, headers=key), 403,
             "operator_key_required")  # failed: out of its group's statistics, the owner's call
    (s, _), _ = _rollouts(op, outcome_by="scorer")
    _refused(http.post(f"/harnessrl/rollouts/{s.id}/finish", json={}, headers=_bearer(s.api_key("m"))), 403,
             "outcome_by_scorer")
    assert op.get_rollout(b.id)["status"] == op.get_rollout(s.id)["status"] == "running"
    assert http.post(f"/harnessrl/rollouts/{a.id}/finish", json={}, headers=key).json()["status"] == "finished"


def test_row_operator_key_still_works_everywhere_also_inside_an_hrl_key(proxy):
    _, op, http = proxy
    (a, _), _ = _rollouts(op)
    legacy = _bearer(f"hrl-{a.id}-main:{KEY}")
    assert http.get("/harnessrl/rollouts", headers=legacy).status_code == 200
    assert http.get("/metrics", headers=legacy).status_code == 200
    assert _chat(a.base_url("main"), f"hrl-{a.id}-main:{KEY}")


def test_row_forged_or_bare_keys_are_401(proxy):
    _, op, http = proxy
    (a, b), _ = _rollouts(op)
    tag = a.api_key("main").split(":")[1]
    for key in (f"hrl-{b.id}-main:{tag}", f"hrl-{a.id}-main", f"hrl-{a.id}-main:rk_{'0' * 32}", tag):
        r = http.post(f"/r/{b.id}/a/main/v1/chat/completions", headers=_bearer(key),
                      json={"model": "m", "messages": MSGS, "max_tokens": 2})
        _refused(r, 401, "invalid_api_key")
        _refused(http.get(f"/harnessrl/rollouts/{b.id}", headers=_bearer(key)), 401, "invalid_api_key")


def test_row_viewer_refuses_a_rollout_key(proxy):
    """The viewer (as the proxy serves it at /ui, with the proxy's key) takes the operator's key only."""
    _, op, _ = proxy
    ro = op.create_rollout(task_id="t")
    with serve(standalone(create_viewer(DB[0], api_key=KEY))) as url:
        r = httpx.get(url + "/ui/api/rollouts", headers=_bearer(ro.api_key("main")))
        assert r.status_code == 401
        assert httpx.get(url + "/ui/api/rollouts", headers=OP).status_code == 200


def test_embedded_proxy_without_a_key_refuses_management_to_all_but_its_owner(tmp_path, upstream):
    with owned_proxy(ProxyConfig(db=str(tmp_path / "runs.db"), upstream=upstream, port=0)) as p:
        with HarnessRL(p.url) as owner:  # this process started it: it holds the key
            ro = owner.create_rollout(task_id="t")
            assert owner.list_rollouts()[0]["id"] == ro.id
        for headers in ({}, {"Authorization": "Bearer anything"}):
            _refused(httpx.get(p.url + "/harnessrl/rollouts", headers=headers), 401, "invalid_api_key")
            _refused(httpx.post(p.url + f"/harnessrl/rollouts/{ro.id}/finish", json={}, headers=headers), 401,
                     "invalid_api_key")
        _refused(httpx.get(p.url + "/harnessrl/rollouts", headers=_bearer(ro.api_key("main"))), 403,
                 "operator_key_required")
        assert _chat(ro.base_url("main"), ro.api_key("main"))  # its model calls: with its own key


# `harnessrl run`: the program tries what a reward-hacking policy would with the key it was given
ATTACKER = textwrap.dedent("""
    import json, os, sys, httpx, openai
    proxy, me = os.environ["HARNESSRL_PROXY"], os.environ["HARNESSRL_ROLLOUT"]
    key = os.environ["OPENAI_API_KEY"]
    auth = {"Authorization": "Bearer " + key}
    openai.OpenAI(max_retries=0).chat.completions.create(model="m", max_tokens=2,
                                                        messages=[{"role": "user", "content": "hi"}])
    out = {"env": sorted(k for k in os.environ if "KEY" in k), "key": key,
           "list": httpx.get(proxy + "/harnessrl/rollouts", headers=auth).status_code,
           "own_outcome": httpx.post(f"{proxy}/harnessrl/rollouts/{me}/reward", json={"value": 1.0},
                                     headers=auth).status_code,
           "mate_finish": httpx.post(f"{proxy}/harnessrl/rollouts/{sys.argv[2]}/finish",
                                     json={"error": "x"}, headers=auth).status_code,
           "own_finish": httpx.post(f"{proxy}/harnessrl/rollouts/{me}/finish", json={}, headers=auth).status_code}
    open(sys.argv[1], "w").write(json.dumps(out))
    sys.exit(1)
""")


def test_harnessrl_run_gives_the_program_its_rollout_key_only(proxy, tmp_path, monkeypatch):
    url, op, _ = proxy
    mate = op.create_rollout(task_id="t", group_id="g-run")
    script, report = tmp_path / "attack.py", tmp_path / "report.json"
    script.write_text(ATTACKER)
    monkeypatch.setenv("HARNESSRL_PROXY_API_KEY", KEY)
    monkeypatch.setenv("HARNESSRL_UI_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-users-own")  # no interception: replaced by the rollout's
    code = run_command([sys.executable, str(script), str(report), mate.id],
                       RunOptions(task="t", group="g-run", reward_from="exit-code"), url, None, "", None)
    assert code == 1
    got = json.loads(report.read_text())
    assert KEY not in json.dumps(got) and "HARNESSRL_PROXY_API_KEY" not in got["env"]
    assert "HARNESSRL_UI_API_KEY" not in got["env"] and got["key"].split(":")[1].startswith("rk_")
    assert got == {**got, "list": 403, "own_outcome": 403, "mate_finish": 403, "own_finish": 403}
    ours = [r for r in op.list_rollouts(group_id="g-run") if r["id"] != mate.id]
    assert [r["status"] for r in ours] == ["finished"] and op.get_rollout(mate.id)["status"] == "running"
    # the one outcome is the exit code's (1 → 0.0), not the 1.0 the program posted
    assert [(w["kind"], w["value"]) for w in op.get_rollout(ours[0]["id"])["rewards"]] == [("outcome", 0.0)]


def test_harnessrl_reward_inside_a_rollout_uses_its_own_key(proxy, tmp_path, monkeypatch):
    """Without an outcome source the program reports its own (`harnessrl reward`, $HARNESSRL_KEY)."""
    url, op, _ = proxy
    script = tmp_path / "report.py"
    script.write_text("import os\nfrom harnessrl.app.rollouts.run_cmd import report_reward\n"
                      "report_reward(os.environ['HARNESSRL_PROXY'], os.environ['HARNESSRL_ROLLOUT'], 0.75, "
                      "'outcome')\n")
    monkeypatch.setenv("HARNESSRL_PROXY_API_KEY", KEY)
    assert run_command([sys.executable, str(script)], RunOptions(task="t-own", group="g-own"), url, None, "",
                       None) == 0
    (ro,) = op.list_rollouts(group_id="g-own")
    assert ro["status"] == "finished"
    assert [(w["kind"], w["value"]) for w in op.get_rollout(ro["id"])["rewards"]] == [("outcome", 0.75)]


def test_a_client_with_a_rollout_key_gets_the_proxys_message(proxy):
    url, op, _ = proxy
    (a, b), _ = _rollouts(op)
    with HarnessRL(url, api_key=a.api_key("main")) as harness, pytest.raises(HarnessRLError, match="HTTP 403"):
        harness.finish(b.id)


def test_compile_says_which_outcome_it_used_when_a_rollout_has_several(tmp_path, tiny_model_dir):
    from harnessrl.compiler.pipeline import CompileOptions, Compiler
    from harnessrl.compiler.summary import summary_notes

    db = str(tmp_path / "runs.db")
    with owned_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0)) as p, \
            HarnessRL(p.url) as op:
        ro = op.create_rollout(task_id="t", group_id="g")
        _chat(ro.base_url("main"), "unused")
        with HarnessRL(p.url, api_key=ro.api_key("main")) as harness:
            harness.reward(ro.id, 0.2)  # the harness's own report (its outcome is the harness's)
        op.reward(ro.id, 0.9)  # then a corrected grade
        once = op.create_rollout(task_id="t", group_id="g")
        _chat(once.base_url("main"), "unused")
        op.reward(once.id, 0.4)
        op.finish(ro.id)
        op.finish(once.id)
    stats = Compiler(db, CompileOptions(out=tmp_path / "out", tokenizer=str(tiny_model_dir))).run()
    assert stats["rollouts"][ro.id]["outcome"] == 0.9 and stats["rollouts"][once.id]["outcome"] == 0.4
    assert stats["totals"]["several_outcomes"] == 1
    assert [n for n in summary_notes(stats) if "several outcome" in n] == [
        "1 rollouts had several outcome rewards: the latest reported of each was used (stats.json: `outcome` per "
        "rollout)"]
