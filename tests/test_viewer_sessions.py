"""The rollout page's layout for long sessions and for what refused calls recorded
(viewer/flow.py, docs/viewer.md "Long sessions"): real records DBs (the ORM for a 100-turn CLI
session, the real proxy for refused calls), the viewer on a real socket."""

from __future__ import annotations

import httpx
from viewer_fixtures import RATE_LIMITED, insert_long_session, serve

from harnessrl.db import open_db
from harnessrl.records import Call, Rollout
from harnessrl.viewer.app import create_viewer


def test_long_sessions_are_flat_with_or_without_token_ids(tmp_path):
    """A 100-turn CLI session laid out the same whether its parents come from the compiler's
    token trees or (text-only upstream) from message prefixes: the chain flat at depth 0, the
    refused attempt of turn 40 forking off turn 39 one level in, the side agents not main, the
    tool schemas sent once, each call adding only its tool result."""
    db = str(tmp_path / "runs.db")
    made = {"long": insert_long_session(db, "long"), "text": insert_long_session(db, "text", token_ids=False)}
    viewer = create_viewer(db)
    with serve(viewer) as url:
        views = {r: httpx.get(f"{url}/api/rollouts/{r}").json() for r in made}
        page = httpx.get(f"{url}/rollouts/long").text
    viewer.state.engine.dispose()
    assert len(views["long"]["trees"]) == 3 and views["text"]["trees"] == []  # only one has token ids
    for name, v in views.items():
        ids = made[name]
        haiku, claude, explore = v["sessions"]
        assert v["main_agent"] == "claude" and [s["main"] for s in v["sessions"]] == [False, True, False], name
        assert [r["call"] for r in claude["rows"]] == ids["main"][:40] + [ids["error"]] + ids["main"][40:]
        rows = {r["call"]: r for r in claude["rows"]}
        assert {rows[c]["depth"] for c in ids["main"]} == {0} and rows[ids["error"]]["depth"] == 1, name
        assert rows[ids["error"]]["parent"] == rows[ids["main"][40]]["parent"] == ids["main"][39]
        assert rows[ids["main"][40]]["fork"] and rows[ids["main"][40]]["turn"] == 40
        assert rows[ids["main"][99]]["turn"] == 99
        assert (claude["calls"], claude["errors"], claude["max_depth"]) == (101, 1, 1)
        assert [(r["depth"], r["cause"]) for r in haiku["rows"]] == [(0, "start"), (0, "rewrite")]  # one-shot calls
        assert [r["depth"] for r in explore["rows"]] == [0, 0, 0] and explore["dispatched_by"] == ids["main"][10]
        assert v["dispatches"] == {ids["main"][10]: [{"anchor": explore["anchor"], "key": "session:sub1", "calls": 3}]}
        calls = {c["id"]: c for c in v["calls"]}
        assert [t["name"] for t in calls[ids["main"][0]]["tools"]] == ["Bash", "Read"]
        assert {calls[c]["tools_same_as"] for c in ids["main"][1:] + [ids["error"]]} == {ids["main"][0]}
        assert all(calls[c]["tools"] == [] for c in ids["main"][1:])
        assert [m["role"] for m in calls[ids["main"][5]]["messages"]] == ["tool"]  # not the 11 before it
        assert calls[ids["error"]]["preview"] == RATE_LIMITED and calls[ids["error"]]["status"] == "error"
    assert page.count('class="schemas"') == 3 and page.count("<details class=\"side\"") == 2
    # the schemas once per session (haiku, claude, explore), not with each of 106 calls; one row
    # indented: the refused attempt
    assert page.count('class="node call d1') == 1


def test_the_main_agent_rule(tmp_path):
    """`main` when an agent has that name; else the most calls, then the most tokens."""
    _, make = open_db(str(tmp_path / "runs.db"))
    cases = {"named": [("helper", 5), ("helper", 5), ("main", 1)], "calls": [("a", 100), ("b", 1), ("b", 1)],
             "tokens": [("a", 1), ("b", 50), ("a", 1), ("b", 50)], "tie": [("a", 7), ("b", 7)]}
    with make.begin() as s:
        for rid, agents in cases.items():
            s.add(Rollout(id=rid, status="finished", next_seq=len(agents), created_at=0.0))
            s.flush()
            for seq, (agent, tokens) in enumerate(agents):
                s.add(Call(id=f"{rid}{seq}", rollout_id=rid, seq=seq, agent=agent, endpoint="chat",
                           request={"messages": [{"role": "user", "content": f"{agent} {seq}"}]}, status="ok",
                           prompt_tokens=tokens, completion_tokens=1, created_at=0.0))
    viewer = create_viewer(str(tmp_path / "runs.db"))
    with serve(viewer) as url:
        found = {rid: httpx.get(f"{url}/api/rollouts/{rid}").json()["main_agent"] for rid in cases}
    viewer.state.engine.dispose()
    assert found == {"named": "main", "calls": "b", "tokens": "b", "tie": "a"}  # a tie: the earlier agent


def test_refused_malformed_bodies_show_as_sent(tiny_model_dir, tmp_path):
    """A refused call is recorded with its body as sent, so a rollout page meets malformed
    requests: messages that are no list, tools that are a string, tool calls without a
    function, a body that was no JSON object. Each shows (as JSON text), with its reason."""
    from harnessrl.client import HarnessRL
    from harnessrl.proxy.local.backend import LocalBackend
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    db = str(tmp_path / "runs.db")
    bodies = [{"model": "t", "messages": {"role": "user", "content": "<b>not a list</b>"}},
              {"model": "t", "messages": [{"role": "user", "content": "x"}], "tools": "nope"},
              {"model": "t", "messages": [{"role": "user", "content": "x"},
                                          {"role": "assistant", "tool_calls": [{"function": "f"}, 7]}]},
              {"model": "t", "messages": [{"role": "user", "content": "x"}, "odd"]},
              [1, 2]]
    backend = LocalBackend(tiny_model_dir, seed=0)
    try:
        with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0), backend=backend) as proxy:
            with HarnessRL(proxy.url) as hrl:
                ro = hrl.create_rollout(task_id="bad")
                for body in bodies:
                    assert httpx.post(ro.base_url("bad") + "/chat/completions", json=body).status_code == 400
    finally:
        backend.close()
    viewer = create_viewer(db)
    with serve(viewer) as url:
        view = httpx.get(f"{url}/api/rollouts/{ro.id}").json()
        page = httpx.get(f"{url}/rollouts/{ro.id}")
    viewer.state.engine.dispose()
    assert page.status_code == 200 and view["rollout"]["errors"] == 5
    calls = view["calls"]
    assert [c["status"] for c in calls] == ["error"] * 5 and all(c["preview"].startswith("400 ") for c in calls)
    shown = [[(m["role"], m["content"], m["tool_calls"]) for m in c["messages"]] for c in calls]
    assert shown[0] == [("messages", '{"role": "user", "content": "<b>not a list</b>"}', [])]
    assert calls[1]["n_tools"] == 0 and calls[1]["tools"] == []  # "nope" is no list of schemas
    assert shown[2][-1] == ("assistant", "", [{"name": None, "arguments": None}])  # the dict without a function
    assert shown[3] == [("messages", '[{"role": "user", "content": "x"}, "odd"]', [])]  # not all messages: whole
    assert shown[4] == []  # no JSON object: nothing was recorded but the reason
    assert "&lt;b&gt;not a list&lt;/b&gt;" in page.text
