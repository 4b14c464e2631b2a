"""The toolbox's opt-in compact prompt (what bench/learning.py trains on): the same tasks with a
short system text and tool schemas of a name and a parameter. The default prompt is untouched;
the compact one is shorter, survives a tasks file, and tool-call validity still tells a right
call from a wrong one under its schemas."""

import pytest

from harnessrl.harness_examples.toolbox import tasks as toolbox
from harnessrl.compiler.response import ParsedCall
from harnessrl.compiler.rewards import call_valid


@pytest.mark.unit
def test_the_default_prompt_is_unchanged_and_compact_is_opt_in():
    task = toolbox.generate(0)[0][0]
    assert not task.compact and "compact" not in task.row()["meta"]
    assert task.messages()[0]["content"] == toolbox.SYSTEM and task.tools == toolbox.TOOLS
    short = toolbox.generate(0, compact=True)[0][0]
    assert (short.item, short.attribute, short.value) == (task.item, task.attribute, task.value)
    assert short.messages()[0]["content"] == toolbox.COMPACT_SYSTEM and short.tools == toolbox.COMPACT_TOOLS
    assert len(str(short.messages()) + str(short.tools)) < 0.6 * len(str(task.messages()) + str(task.tools))
    planner = toolbox.generate(0, delegate=True, compact=True)[0][0]
    assert planner.tools == [toolbox.COMPACT_ASK_WORKER] and planner.worker_tools == toolbox.COMPACT_TOOLS


@pytest.mark.unit
def test_compact_tasks_survive_a_tasks_file_and_reach_the_sft_lines(tmp_path):
    train, _ = toolbox.generate(1, delegate=True, compact=True)
    back = toolbox.read(toolbox.write(train, tmp_path / "t.jsonl", sft=True))
    assert back[:64] == train and all(t.compact and not t.delegate for t in back[64:])  # then the workers' lines
    rows = toolbox.inconsistent_expert(train[:2], toolbox.world(1), {"size": "color"}, traces=3, right=1)
    assert all(r["meta"].get("compact") for r in rows)
    assert {r["tools"][0]["function"]["name"] for r in rows} >= {"get_color", "ask_worker"}
    drill = toolbox.copy_drill(["piano"], compact=True)
    assert drill[0]["tools"] == [toolbox.tool_schema("find", "item", "", compact=True)]
    assert "description" not in drill[0]["tools"][0]["function"]


@pytest.mark.unit
def test_validity_under_compact_schemas_still_rejects_wrong_calls():
    tools = toolbox.COMPACT_TOOLS
    assert call_valid(ParsedCall("get_size", {"item": "piano"}), tools)
    assert not call_valid(ParsedCall("get_mass", {"item": "piano"}), tools)  # no such tool
    assert not call_valid(ParsedCall("get_size", {"name": "piano"}), tools)  # no such argument
    assert not call_valid(ParsedCall("get_size", None), tools)  # arguments that do not parse
