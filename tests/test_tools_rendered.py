"""A request's tools are never dropped silently (issue 52): where the model's chat template renders
no tools, the proxy refuses the call with an OpenAI-shaped 400 naming the model and the fix (a
failed call of its rollout), `harnessrl vllm` and `sft` refuse with one line. The tiny model
with a template that ignores tools stands in for SmolLM2's own (the real-model tier runs that)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.tool_rendering import renders_tools, template_renders_tools

# a template of the kind SmolLM2-Instruct ships: every message, no tools
NO_TOOLS = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# renders only the first tool: half a tool list is still a dropped tool
FIRST_ONLY = ("{% if tools %}{{ tools[0]['function']['name'] }}{% endif %}" + NO_TOOLS)
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def _with_template(tiny_model_dir: Path, out: Path, template: str) -> Path:
    out.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.name != "chat_template.jinja":
            (out / f.name).symlink_to(f)
    (out / "chat_template.jinja").write_text(template)
    return out


@pytest.mark.unit
def test_the_check_catches_templates_that_drop_some_or_all_tools(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    assert template_renders_tools(AutoTokenizer.from_pretrained(tiny_model_dir))
    for name, template in (("none", NO_TOOLS), ("first", FIRST_ONLY)):
        tok = AutoTokenizer.from_pretrained(_with_template(tiny_model_dir, tmp_path / name, template))
        assert not template_renders_tools(tok), name

    def raises(messages, tools):
        raise ValueError("tools are not supported")

    assert not renders_tools(raises)


def test_proxy_refuses_tools_a_template_cannot_render_and_records_the_refusal(tiny_model_dir, tmp_path):
    import openai

    from harnessrl.db import open_db
    from harnessrl.proxy.server import ProxyConfig, run_proxy
    from harnessrl.records import Call

    model = _with_template(tiny_model_dir, tmp_path / "notools", NO_TOOLS)
    db = str(tmp_path / "runs.db")
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(model), port=0)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/r/r1/a/agent/v1", api_key="x")
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as err:
                client.chat.completions.create(model="notools", messages=ask, tools=[TOOL], max_tokens=4, stream=stream)
            body = err.value.body
            assert (body["code"], body["param"]) == ("tools_not_rendered", "tools")
            assert "notools" in body["message"] and "harnessrl smollm2" in body["message"]
        assert client.chat.completions.create(model="notools", messages=ask, max_tokens=2).choices  # no tools: served
        # tool_choice "none" hides the tools by the API's own rule: nothing to render, nothing dropped
        assert client.chat.completions.create(model="notools", messages=ask, tools=[TOOL], tool_choice="none",
                                              max_tokens=2).choices
    _, Session = open_db(db)
    with Session() as s:
        rows = s.query(Call).all()
    assert sorted(c.status for c in rows) == ["error", "error", "ok", "ok"]
    assert all(c.prompt_ids is None for c in rows if c.status == "error")  # no prompt was made without the tools


def _harnessrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("harnessrl")), *args], capture_output=True, text=True,
                          timeout=300)


def test_vllm_and_sft_refuse_in_one_line(tiny_model_dir, tmp_path):
    model = _with_template(tiny_model_dir, tmp_path / "notools", NO_TOOLS)
    r = _harnessrl("vllm", str(model), "--dry-run")
    assert r.returncode == 2 and "renders no tools" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # vLLM's own --chat-template is the user's choice: passed through, not second-guessed
    r = _harnessrl("vllm", str(model), "--dry-run", "--chat-template", str(tmp_path / "t.jinja"))
    assert r.returncode == 0 and "--chat-template" in r.stdout
    assert _harnessrl("vllm", str(tiny_model_dir), "--dry-run").returncode == 0
    tasks = tmp_path / "sft.jsonl"
    call = {"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    tasks.write_text(json.dumps({"id": "t", "input": "Weather in Oslo?", "tools": [TOOL], "expert_trace": [
        {"role": "assistant", "content": "", "tool_calls": [call]}]}) + "\n")
    r = _harnessrl("sft", str(tasks), "--model", str(model), "--out", str(tmp_path / "warm"), "--steps", "1")
    assert r.returncode == 2 and "renders no tools" in r.stderr and "Traceback" not in r.stderr
