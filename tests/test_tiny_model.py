"""The tiny model's tokenizer, chat template and imprint data (the imprinted behaviour itself is
checked through the local backend in test_local_backend.py)."""

from __future__ import annotations

import json

import torch

from harnessrl import tiny_model as tm


def test_tokenizer_build_is_deterministic():
    a, b = tm.build_tokenizer(seed=0), tm.build_tokenizer(seed=0)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()


def test_chat_template_renders_roles_tools_calls_and_think(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "", "reasoning_content": "hm",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}},
                        {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": {"q": "y"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "tool_call_id": "c2", "content": "2"},
        {"role": "assistant", "content": "Done."},
    ]
    text = tok.apply_chat_template(messages, tools=[tool], tokenize=False, add_generation_prompt=True)
    tools_json = json.dumps(tool["function"])
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" + tools_json + "\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nHi?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nhm\n</think>\n\n"
        '<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "lookup", "arguments": {"q": "y"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>\n<|im_end|>\n"
        "<|im_start|>assistant\nDone.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for special in ("<tool_call>", "</tool_call>", "<think>", "</think>", "<|im_end|>"):
        assert ids.count(tok.convert_tokens_to_ids(special)) == text.count(special)


def test_model_directory(tiny_model_dir):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    gen = GenerationConfig.from_pretrained(tiny_model_dir)
    assert config.architectures == ["Qwen2ForCausalLM"] and config.vocab_size == len(tok)
    assert set(gen.eos_token_id) == {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    assert (tiny_model_dir / "model.safetensors").stat().st_size < 10 * 2**20
    # the tokenizer served from the directory splits text exactly as the one the model was trained with
    text = tm._chat_texts(seed=7, n=1)[0] + " naïve café 123"
    assert tok(text, add_special_tokens=False)["input_ids"] == tm.build_tokenizer(seed=0)(text, add_special_tokens=False)["input_ids"]


def test_imprint_labels_are_exactly_the_assistant_turns():
    tok = tm.build_tokenizer(seed=0)
    batches = tm._training_batches(tok, seed=0, n=12, batch_size=4)
    assert len(batches) == 3
    turns = 0
    for ids, labels in batches:
        for row_ids, row_labels in zip(ids.tolist(), labels.tolist()):
            text = tok.decode(row_ids, skip_special_tokens=False)
            # each labelled run is one assistant turn: it follows the generation prompt and ends at EOS
            runs, run = [], []
            for i, (t, lab) in enumerate(zip(row_ids, row_labels)):
                if lab != -100:
                    assert lab == t
                    if not run:
                        assert tok.decode(row_ids[:i], skip_special_tokens=False).endswith("<|im_start|>assistant\n")
                    run.append(t)
                elif run:
                    runs.append(run)
                    run = []
            runs += [run] if run else []
            assert all(tok.decode(r, skip_special_tokens=False).endswith("<|im_end|>") for r in runs)
            assert len(runs) == text.count("<|im_start|>assistant\n")
            turns += len(runs)
    assert turns >= 12
    again = tm._training_batches(tok, seed=0, n=12, batch_size=4)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches, again))


def test_a_build_that_never_passes_its_probes_is_refused(tmp_path):
    """20 steps never reach the first probe mark (60): the build says so instead of leaving a model
    whose tool calls break other tests far from the cause (the vLLM shape did, on transformers 5.25)."""
    import pytest

    from harnessrl.errors import UserError

    with pytest.raises(UserError, match="did not learn its chat format in 20 steps"):
        tm.build_tiny_model(tmp_path / "m", steps=20)
    assert not (tmp_path / "m" / "config.json").exists()


def test_vllm_shape_passes_its_probes(vllm_model_dir):
    """The model vLLM serves in the real-server tests calls its tool greedily (its build checks the
    probes with transformers; this reads the saved, untied copy back)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    assert tm._probes_pass(model, AutoTokenizer.from_pretrained(vllm_model_dir))
