"""The trace viewer's data and HTTP surface over rollouts recorded through the real proxy (see
viewer_fixtures.py), served by uvicorn on a real socket: the list's filters, sorts and paging,
the rollout view (trees, classes, rewards, the compile output's advantages), the group view,
errors, the security headers, the runs page, and paging that stays on indexes at 100k rollouts."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest
from sqlalchemy import insert, text
from viewer_fixtures import CRAFTED, HARNESS, SCRIPT, compile_samples, record_all, serve

from harnessrl.db import open_db
from harnessrl.errors import UserError
from harnessrl.records import Reward, Rollout
from harnessrl.viewer.app import CSP, create_viewer, standalone
from harnessrl.viewer.queries import ListQuery, list_rollouts


@pytest.fixture(scope="module")
def site(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("viewer")
    db = str(tmp / "runs.db")
    ids = record_all(db, tiny_model_dir)
    compiled = compile_samples(db, tmp / "compiled")
    loop = tmp / "loop"
    loop.mkdir()
    (loop / "loop_state.json").write_text(json.dumps({"model": "ckpt-1", "attempts": 2, "initial_eval": 0.25, "rounds": [
        {"round": 0, "train_reward": 0.5, "train_success": 0.25, "tool_validity": 0.75, "eval_success": 0.5,
         "tokens": 900, "samples": 16, "seconds": 3.2, "version": "v1", "checkpoint": "ckpt-0"},
        {"round": 1, "train_reward": 0.75, "train_success": 0.5, "tool_validity": 1.0, "eval_success": 0.75,
         "tokens": 950, "samples": 16, "seconds": 3.0, "version": "v2", "checkpoint": "ckpt-1"}]}))
    viewer = create_viewer(db, samples=compiled, loop=loop)
    with serve(standalone(viewer)) as url:
        with httpx.Client(base_url=url + "/ui") as client:
            yield client, ids, compiled
    viewer.state.engine.dispose()


def _ids(data):
    return [r["id"] for r in data["rows"]]


def test_list_filters_sorts_and_pages(site, tiny_model_dir):
    client, ids, _ = site
    tiny_model = tiny_model_dir
    everything = client.get("/api/rollouts").json()
    assert everything["total"] == 4 and set(_ids(everything)) == {ids["planner"], ids["retry"], ids["running"], "crafted"}
    row = next(r for r in everything["rows"] if r["id"] == ids["planner"])
    # planner: 3 calls in 2 sessions (agent:planner, session:s1) by 2 agents, 8 generated tokens each
    assert (row["calls"], row["sessions"], row["agents"], row["tokens"], row["reward"]) == (3, 2, 2, 24, 1.0)
    # the harness's User-Agent, the model that served (the local checkpoint), the API surface
    assert row["harness"][0].startswith("OpenAI/Python") and len(row["harness"]) == 1
    assert (row["model"], row["surface"], row["errors"]) == ([str(tiny_model)], ["chat"], 0)
    running = next(r for r in everything["rows"] if r["id"] == ids["running"])
    # its three refused calls: another harness, the model name as sent, three surfaces (the two
    # most used named: chat twice, then messages before responses by name), three errors
    assert running["errors"] == 3 and running["calls"] == 4 and running["harness"][0] == HARNESS
    assert running["harness"][1].startswith("OpenAI/Python") and running["model"] == ["tiny", str(tiny_model)]
    assert running["surface"] == ["chat", "messages"] and running["more"] == {"harness": 0, "model": 0, "surface": 1}
    crafted = next(r for r in everything["rows"] if r["id"] == "crafted")
    assert crafted["surface"] == ["chat"] and crafted["harness"] == []  # no surface recorded: its endpoint
    assert _ids(client.get("/api/rollouts", params={"errors": "yes"}).json()) == [ids["running"]]
    assert ids["running"] not in _ids(client.get("/api/rollouts", params={"errors": "no"}).json())
    assert _ids(client.get("/api/rollouts", params={"sort": "errors"}).json())[0] == ids["running"]
    assert set(_ids(client.get("/api/rollouts", params={"run": "round-0"}).json())) == {ids["planner"], ids["retry"]}
    assert _ids(client.get("/api/rollouts", params={"status": "running"}).json()) == [ids["running"]]
    assert _ids(client.get("/api/rollouts", params={"group": "g2", "task": "t2", "status": "finished"}).json()) == ["crafted"]
    # rewards 1.0, 0.0, 0.25, 1.0: the range [0.1, 0.5] holds only the running rollout's 0.25
    assert _ids(client.get("/api/rollouts", params={"reward_min": "0.1", "reward_max": "0.5"}).json()) == [ids["running"]]
    by_reward = client.get("/api/rollouts", params={"sort": "reward", "order": "asc"}).json()
    assert [r["reward"] for r in by_reward["rows"]] == [0.0, 0.25, 1.0, 1.0]
    pages = [client.get("/api/rollouts", params={"per_page": "3", "page": str(p)}).json() for p in (1, 2)]
    assert [p["pages"] for p in pages] == [2, 2] and len(_ids(pages[0])) == 3
    assert set(_ids(pages[0]) + _ids(pages[1])) == set(_ids(everything))  # pages partition the list
    html = client.get("/", params={"run": "round-1"}).text
    assert f'data-rollout="{ids["running"]}"' in html and f'data-rollout="{ids["planner"]}"' not in html
    assert "fixture-harness/1.0 &lt;b&gt;ua&lt;/b&gt;" in html and 'class="num errors has-errors">3<' in html


def test_bad_queries_are_one_line_errors(site):
    client, _, _ = site
    r = client.get("/api/rollouts", params={"reward_min": "lots"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "reward_min='lots' is not a number"
    r = client.get("/api/rollouts", params={"errors": "maybe"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "errors='maybe': use yes or no"
    r = client.get("/api/rollouts", params={"sort": "colour"})
    assert r.status_code == 400 and "sort='colour'" in r.json()["error"]["message"]
    r = client.get("/api/rollouts/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    page = client.get("/rollouts/nope")
    assert page.status_code == 404 and "no rollout &#39;nope&#39; in the records DB" in page.text


def test_rollout_view_trees_classes_rewards(site):
    client, ids, _ = site
    v = client.get(f"/api/rollouts/{ids['planner']}").json()
    assert [c["id"] for c in v["calls"]] == [ids["p0"], ids["w0"], ids["p1"]]
    planner, worker = v["trees"]
    assert planner["key"] == "agent:planner" and worker["key"] == "session:s1"
    assert [n["call"] for n in planner["nodes"]] == [ids["p0"], ids["p1"]]
    assert planner["nodes"][1]["parent"] == 0  # p1's prompt extends p0's prompt + completion: merged
    assert worker["dispatched_by"] == ids["p0"] and v["timeline"]["edges"] == [{"from": 0, "to": 1}]
    assert v["outcome"] == 1.0 and v["calls"][0]["process"] == {"<i>fmt</i>": 0.5}
    # p1 added one message after the parent's two and its reply
    assert v["calls"][2]["added_from"] == 3 and [m["content"] for m in v["calls"][2]["messages"]] == ["Worker says: Paris."]

    # the refused call: in its session's chain (it repeats q0's messages: a fork of the root), its reason shown
    running = client.get(f"/api/rollouts/{ids['running']}").json()
    refused = next(c for c in running["calls"] if c["id"] == ids["refused"])
    assert (refused["status"], refused["surface"], refused["client"]) == ("error", "chat", HARNESS)
    assert refused["preview"] == refused["error"] == "400 invalid_request_error: 'max_tokens' must be an integer >= 1"
    assert [(r["call"], r["depth"], r["cause"]) for r in running["sessions"][0]["rows"]] == [
        (ids["q0"], 0, "start"), (ids["refused"], 0, "branch")]  # two one-shot roots: a list
    assert running["rollout"]["errors"] == 3 and running["main_agent"] == "solo"  # 2 calls each; solo's tokens
    # refused before translation: the surface's own messages / input, shown as they came
    shown = {c["id"]: [(m["role"], m["content"]) for m in c["messages"]] for c in running["calls"]}
    assert shown[ids["refused_messages"]] == [("user", f"hi {SCRIPT}")]
    assert shown[ids["refused_responses"]] == [("user", "hello")]
    assert "hi &lt;script&gt;" in client.get(f"/rollouts/{ids['running']}").text
    retry = client.get(f"/api/rollouts/{ids['retry']}").json()
    (tree,) = retry["trees"]
    assert tree["nodes"][0]["children"] == [1, 2] and tree["nodes"][1]["branch"] and tree["nodes"][2]["branch"]

    crafted = client.get("/api/rollouts/crafted").json()
    toks = crafted["calls"][0]["tokens"]
    assert "".join(t["text"] for t in toks).replace("·", " ").replace("↵\n", "\n") == CRAFTED
    by_class = {c: "".join(t["text"] for t in toks if t["cls"] == c) for c in ("reasoning", "action", "args")}
    assert "lookup" in by_class["action"] and "pwned" in by_class["args"] and "plan" in by_class["reasoning"]
    assert any(t["special"] and t["text"] == "<|im_end|>" for t in toks)
    # the inserted log-probs are −0.05·k: token 0 is p≈1 (bucket 0), token 30 is −1.5 (bucket 2)
    assert toks[0]["lpb"] == 0 and toks[30]["lpb"] == 2


def test_samples_advantages_come_from_the_compile_output(site):
    client, ids, compiled = site
    rows = pq.read_table(compiled / "samples.parquet").to_pylist()
    retry = client.get(f"/api/rollouts/{ids['retry']}").json()
    shown = {s["id"]: s for s in retry["trees"][0]["samples"]}
    mine = [r for r in rows if r["rollout_id"] == ids["retry"]]
    assert len(mine) == 2 and set(shown) == {r["sample_id"] for r in mine}  # one per path of the branch
    for r in mine:
        s = shown[r["sample_id"]]
        start = r["prompt_len"]
        assert [t["adv"] for t in s["tokens"]] == pytest.approx(r["advantage"][start:])
        assert [t["mask"] for t in s["tokens"]] == [bool(m) for m in r["loss_mask"][start:]]
        assert s["trained"] == sum(r["loss_mask"])
    # group g1 has outcomes 1.0 and 0.0: GRPO with the sample std gives ±(0.5 / 0.7071) = ±0.7071
    group = client.get("/api/groups/g1").json()
    adv = {r["id"]: r["advantages"] for r in group["rows"]}
    assert np.allclose(adv[ids["planner"]], 0.7071, atol=1e-3) and np.allclose(adv[ids["retry"]], -0.7071, atol=1e-3)
    assert group["reward_mean"] == 0.5 and group["reward_std"] == pytest.approx(0.7071, abs=1e-4)
    assert 'class="status error">3 errors<' in client.get("/groups/g2").text  # the running rollout's refusals


def test_pages_send_a_strict_csp_and_escape(site):
    client, ids, _ = site
    for path in ("/", f"/rollouts/{ids['retry']}", "/groups/g1", "/runs", "/api/rollouts"):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-security-policy"] == CSP, path
        assert r.headers["x-content-type-options"] == "nosniff"
    assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP
    html = client.get(f"/rollouts/{ids['retry']}").text
    assert SCRIPT not in html and "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in html
    assert html.count("<script") == 1  # the viewer's own static file
    assert client.get("/static/viewer.js").headers["content-type"].startswith("text/javascript")


def test_runs_page(site):
    client, _, _ = site
    r = client.get("/api/runs").json()
    assert [row["version"] for row in r["rounds"]] == ["v1", "v2"]
    # round 0 → x = pad, round 1 → x = width − pad; train reward 0.5 → y = 220 − 30 − 0.5·160 = 110
    assert r["curves"][0]["points"] == "30.0,110.0 530.0,70.0"
    assert 'class="curve curve-1"' in client.get("/runs").text


def test_missing_inputs_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="records DB not found"):
        create_viewer(str(tmp_path / "none.db"))
    open_db(str(tmp_path / "runs.db"))
    with pytest.raises(UserError, match="no samples.parquet"):
        create_viewer(str(tmp_path / "runs.db"), samples=tmp_path)
    with pytest.raises(UserError, match="no loop_state.json"):
        create_viewer(str(tmp_path / "runs.db"), loop=tmp_path)
    (tmp_path / "samples.parquet").write_text("not parquet")
    with pytest.raises(UserError, match="not a Parquet file"):
        create_viewer(str(tmp_path / "runs.db"), samples=tmp_path)


def test_paging_100k_rollouts_stays_on_indexes(tmp_path):
    """100k rollouts with outcome rewards: every list query plan searches an index or walks one in
    order (no full scan sorted in a temp tree), and a page takes well under a second."""
    engine, _ = open_db(str(tmp_path / "big.db"))
    n = 100_000
    rng = np.random.default_rng(0)
    with engine.begin() as c:
        c.execute(insert(Rollout), [{"id": f"r{i:06d}", "task_id": f"t{i % 500}", "group_id": f"g{i // 8}",
                                     "run": f"round-{i // 10000}", "status": "finished" if i % 7 else "running",
                                     "next_seq": 0, "created_at": 1e9 + i} for i in range(n)])
        c.execute(insert(Reward), [{"rollout_id": f"r{i:06d}", "kind": "outcome", "name": "outcome",
                                    "value": float(v), "created_at": 1e9} for i, v in enumerate(rng.random(n))])
    cases = [{}, {"run": "round-3"}, {"status": "running", "sort": "task"}, {"group": "g77"},
             {"reward_min": "0.9"}, {"sort": "reward"}, {"page": "1000"}, {"errors": "no", "sort": "errors"}]
    for params in cases:
        start = time.perf_counter()
        page = list_rollouts(engine, ListQuery.parse(params))
        elapsed = time.perf_counter() - start
        assert page["rows"] and elapsed < 1.5, (params, elapsed)  # ~5–150 ms measured on the shared 2-core box
    with engine.connect() as c:
        plan = " ".join(r[3] for r in c.execute(text(
            "EXPLAIN QUERY PLAN SELECT id FROM rollouts ORDER BY created_at DESC LIMIT 50")))
        assert "ix_rollouts_created_at" in plan and "TEMP B-TREE" not in plan
        plan = " ".join(r[3] for r in c.execute(text(
            "EXPLAIN QUERY PLAN SELECT rollout_id FROM rewards WHERE kind = 'outcome' AND value >= 0.9")))
        assert "ix_rewards_kind_value" in plan
        plan = " ".join(r[3] for r in c.execute(text("EXPLAIN QUERY PLAN SELECT id FROM rollouts WHERE errors > 0")))
        assert "ix_rollouts_errors" in plan
    engine.dispose()


def test_orm_and_migrations_agree(tmp_path):
    """The viewer's indexes exist in the ORM and in the Alembic head alike."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from harnessrl.records import Base

    engine, _ = open_db(str(tmp_path / "runs.db"))
    with engine.connect() as c:
        assert compare_metadata(MigrationContext.configure(c), Base.metadata) == []
        names = {r[0] for r in c.execute(text("SELECT name FROM sqlite_master WHERE type = 'index'"))}
    assert {"ix_rollouts_created_at", "ix_rollouts_status", "ix_rewards_kind_value"} <= names
    engine.dispose()


def test_list_query_on_sqlite_and_postgres(db_target):
    """The same list SQL (string concatenation, distinct counts, the correlated reward sort) on both DBs."""
    from harnessrl.records import Call

    engine, make = open_db(db_target)
    with make.begin() as s:
        for i, reward in enumerate((0.5, None, 0.0)):
            s.add(Rollout(id=f"r{i}", run="a", status="finished", next_seq=0, created_at=float(i)))
            s.flush()
            if reward is not None:
                s.add(Reward(rollout_id=f"r{i}", kind="outcome", name="outcome", value=reward, created_at=0.0))
        s.add(Reward(rollout_id="r1", kind="process", name="fmt", value=9.0, created_at=0.0))
        for seq, (agent, session) in enumerate((("p", None), ("w", "s1"), ("w", "s2"), ("p", None))):
            s.add(Call(id=f"c{seq}", rollout_id="r0", seq=seq, agent=agent, session_id=session, endpoint="chat",
                       surface="responses-ws" if agent == "p" else "messages", client=f"cli-{agent}", model="m",
                       request={}, status="ok", completion_tokens=5, created_at=0.0))
    page = list_rollouts(engine, ListQuery.parse({"sort": "reward", "order": "asc"}))
    # r1 has no outcome (its process reward is not one): last, on both DBs
    assert [(r["id"], r["reward"]) for r in page["rows"]] == [("r2", 0.0), ("r0", 0.5), ("r1", None)]
    r0 = next(r for r in page["rows"] if r["id"] == "r0")
    assert (r0["calls"], r0["sessions"], r0["agents"], r0["tokens"]) == (4, 3, 2, 20)  # agent:p, s1, s2
    # two calls each: a tie, broken by the name
    assert (r0["harness"], r0["model"], r0["surface"]) == (["cli-p", "cli-w"], ["m"], ["messages", "responses-ws"])
    engine.dispose()


def test_tokenizer_falls_back_to_the_loop_checkpoint(tiny_model_dir, tmp_path):
    """Harnesses often send a model name that is no directory ("default"): the loop's current
    checkpoint then gives token text and classes; ids outside its vocabulary are flagged."""
    from harnessrl.records import Call, pack_ids

    db = str(tmp_path / "runs.db")
    _, make = open_db(db)
    with make.begin() as s:
        s.add(Rollout(id="r", status="finished", next_seq=1, created_at=0.0))
        s.flush()
        s.add(Call(id="c", rollout_id="r", seq=0, endpoint="chat", model="default", request={"messages": []},
                   status="ok", prompt_ids=pack_ids([1, 2]), completion_ids=pack_ids([3, 4, 5]), created_at=0.0))
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "loop_state.json").write_text(json.dumps({"model": str(tiny_model_dir), "rounds": []}))
    with make.begin() as s:  # ids no tiny-model token has: recorded with another tokenizer
        s.add(Rollout(id="other", status="finished", next_seq=1, created_at=0.0))
        s.flush()
        s.add(Call(id="o", rollout_id="other", seq=0, endpoint="chat", model="default", request={"messages": []},
                   status="ok", prompt_ids=pack_ids([1]), completion_ids=pack_ids([3, 150000]), created_at=0.0))
    for kwargs, tokens in (({}, 0), ({"loop": loop}, 3)):
        viewer = create_viewer(db, **kwargs)
        with serve(viewer) as url:
            view = httpx.get(f"{url}/api/rollouts/r").json()
            other = httpx.get(f"{url}/rollouts/other")
        viewer.state.engine.dispose()
        assert len(view["calls"][0]["tokens"]) == tokens
        assert view["tokenizer"] == (str(tiny_model_dir) if tokens else None)
        assert other.status_code == 200  # a mismatched tokenizer is flagged, not a crash
        assert ("token ids beyond the vocabulary" in other.text) == bool(tokens)


def test_ui_command_errors_are_one_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "harnessrl", "ui", "--db", str(tmp_path / "none.db")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == f"error: records DB not found: {tmp_path / 'none.db'}"


def test_nul_in_an_id_or_a_filter_is_a_client_error_on_both_dbs(db_target):
    """PostgreSQL cannot compare text holding U+0000 (the route fuzz found a 500 there): no id can
    hold it, so a page for one is a 404, and a filter holding it a 400, on every database."""
    engine, _ = open_db(db_target)
    engine.dispose()
    with serve(standalone(create_viewer(db_target))) as url, httpx.Client(base_url=url) as http:
        for path in ("/ui/rollouts/a%00b", "/ui/api/rollouts/%00", "/ui/groups/g%00", "/ui/api/groups/%00"):
            assert http.get(path).status_code == 404, path
        for key in ("task", "group", "run", "status"):
            r = http.get("/ui/api/rollouts", params={key: "a\x00"})
            assert r.status_code == 400 and "U+0000" in r.json()["error"]["message"], r.text
        assert http.get("/ui/api/rollouts").status_code == 200  # the same connection, still open


def test_an_internal_error_shows_no_database_text(tmp_path):
    """A failing query (here: the table gone under the viewer) is a 500 whose text names no SQL
    and no database message; those go to the log."""
    db = str(tmp_path / "runs.db")
    engine, _ = open_db(db)
    with serve(standalone(create_viewer(db))) as url:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE rollouts"))
        for path in ("/ui/api/rollouts", "/ui/"):
            r = httpx.get(url + path)
            assert r.status_code == 500, r.text
            assert "SELECT" not in r.text and "no such table" not in r.text and "FROM" not in r.text, r.text
    engine.dispose()
