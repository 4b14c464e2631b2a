"""Expert trace structure, the rule segmenter, levels L0–L4, and `harnessrl tasks import`."""

import json
import sys

from sqlalchemy import select

from harnessrl.compiler.traces import segment, structure_trace
from harnessrl.pact_levels import all_levels, reasoning_level
from harnessrl.db import open_db
from harnessrl.records import ExpertTrace, Task

TRACE = [
    {"role": "system", "content": "You are an expert."},
    {"role": "user", "content": "Where was the author of Dune born?"},
    {"role": "assistant", "content": "<think>\nFirst I need the author.\n\nDune is a novel.\n\n"
     "The tool call would be search for Dune author.\n\nThen the birthplace.\n</think>\n\n"
     '<tool_call>\n{"name": "search", "arguments": {"query": "Dune author"}}\n</tool_call>'},
    {"role": "tool", "content": "Frank Herbert"},
    {"role": "assistant", "content": "Herbert it is.\n\nNow his birthplace.",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "search", "arguments": '{"query": "Frank Herbert birthplace"}'}}]},
    {"role": "tool", "content": "Tacoma"},
    {"role": "assistant", "content": "<answer>Tacoma</answer>"},
]


def test_structure_segments_and_levels():
    t = structure_trace(TRACE)
    assert t["final_answer"] == "Tacoma"
    assert [turn["tool_call"] for turn in t["turns"]] == [
        {"name": "search", "arguments": {"query": "Dune author"}},
        {"name": "search", "arguments": {"query": "Frank Herbert birthplace"}}]
    assert [turn["observation"] for turn in t["turns"]] == ["Frank Herbert", "Tacoma"]
    segs = t["turns"][0]["reasoning_segments"]
    assert [s["text"] for s in segs] == ["First I need the author.", "Dune is a novel.",
                                         "The tool call would be search for Dune author.", "Then the birthplace."]
    assert [s["explicit_call_preview"] for s in segs] == [False, False, True, False]
    # 2 safe segments before the first preview: level ℓ shows ⌈ℓ·2/4⌉ = 0, 1, 1, 2, 2 of them
    assert t["turns"][0]["levels"] == ["", "First I need the author.", "First I need the author.",
                                       "First I need the author.\n\nDune is a novel.",
                                       "First I need the author.\n\nDune is a novel."]
    # the second turn's free text before the native call is its reasoning
    assert t["turns"][1]["levels"][4] == "Herbert it is.\n\nNow his birthplace."


def test_preview_rules():
    call = {"name": "lookup", "arguments": {"key": "alpha", "n": 3}}
    flags = [s["explicit_call_preview"] for s in segment(
        'I will check.\n\n{"key": "alpha"}\n\nso lookup(alpha)\n\nuse lookup with alpha and 3\n\nuse lookup on alpha', call)]
    assert flags == [False, True, True, True, False]  # the last one misses the value 3
    # four safe segments: ⌈ℓ·4/4⌉ = ℓ of them
    four = [{"text": str(i), "explicit_call_preview": False} for i in range(4)]
    assert all_levels(four) == ["", "0", "0\n\n1", "0\n\n1\n\n2", "0\n\n1\n\n2\n\n3"]


def test_level_schedule():
    # level(s) = 4 − min(4, ⌊5s/S⌋) with S = 10: s=0,1 → 4; 2,3 → 3; 4,5 → 2; 6,7 → 1; 8.. → 0
    assert [reasoning_level(s, 10) for s in range(11)] == [4, 4, 3, 3, 2, 2, 1, 1, 0, 0, 0]


def run_cli(monkeypatch, capsys, *args):
    """The `harnessrl` entry point in this process: (exit code, stdout, stderr)."""
    from harnessrl.app.cli import main

    monkeypatch.setenv("COLUMNS", "400")  # rich would otherwise wrap the one-line error
    monkeypatch.setattr(sys, "argv", ["harnessrl", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_tasks_import_cli(tmp_path, db_target, monkeypatch, capsys):
    f = tmp_path / "tasks.jsonl"
    rows = [{"id": "t1", "input": "Where was the author of Dune born?", "reference": "Tacoma",
             "reference_calls": [{"name": "search", "arguments": {"query": "Dune author"}}], "expert_trace": TRACE},
            {"id": "t2", "input": [{"role": "user", "content": "2+2?"}], "answer": "4"}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    for _ in range(2):  # re-importing replaces, it does not duplicate
        code, out, err = run_cli(monkeypatch, capsys, "tasks", "import", str(f), "--db", db_target)
        assert code == 0, err
        assert "imported 2 tasks (1 with expert traces)" in out
    _, make = open_db(db_target)
    with make() as s:
        tasks = {t.id: t for t in s.scalars(select(Task))}
        traces = s.scalars(select(ExpertTrace)).all()
    assert tasks["t2"].reference == "4" and tasks["t2"].input == [{"role": "user", "content": "2+2?"}]
    assert tasks["t1"].reference_calls == rows[0]["reference_calls"]
    assert len(traces) == 1 and traces[0].task_id == "t1" and traces[0].messages == TRACE


def test_tasks_import_errors(tmp_path, monkeypatch, capsys):
    db = str(tmp_path / "runs.db")
    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": "a", "input": "x"}\n{"id": "b"\n')
    code, _, err = run_cli(monkeypatch, capsys, "tasks", "import", str(f), "--db", db)
    assert code == 2 and f"{f}:2: not valid JSON" in err and len(err.strip().splitlines()) == 1
    f.write_text('{"id": "a", "input": "x", "reference_calls": [{"arguments": {}}]}\n')
    code, _, err = run_cli(monkeypatch, capsys, "tasks", "import", str(f), "--db", db)
    assert code == 2 and "reference_calls must be a list" in err
    code, _, err = run_cli(monkeypatch, capsys, "tasks", "import", str(tmp_path / "missing.jsonl"), "--db", db)
    assert code == 2 and "tasks file not found" in err
    # nothing was written by the failed imports
    _, make = open_db(db)
    with make() as s:
        assert s.scalars(select(Task)).all() == []
