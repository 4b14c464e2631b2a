"""Build the tiny test model offline and deterministically.

A small Qwen2-architecture causal LM and a byte-level BPE tokenizer with a Qwen/hermes-style
chat template (system/user/assistant/tool messages, tool schemas, `<tool_call>` JSON,
`<think>`). Both are made from synthetic chats rendered with that template: the tokenizer is
trained on them, then the randomly initialised model is trained on their assistant turns for a
fixed, seeded run, so that with greedy decoding it answers a question with a `<tool_call>` when
tools are given (naming DEFAULT_TOOL: see TOOL_NAMES), answers a tool result with a short text,
and ends its turns with EOS. Tests and the demo use it because nothing can be downloaded; any
real HF checkpoint directory works in its place.
"""

from __future__ import annotations

import json
import random
import re
from importlib import resources
from pathlib import Path

from harnessrl.errors import UserError
from harnessrl.toolcalls import BLOCK, tool_calls_in

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]

_WORDS = (
    "the a an of to and in is it that for on with as by at from this be or are was which "
    "what who where when how why find search look up key value answer question result tool "
    "call function name arguments query city country river capital born year founded author "
    "book company planner worker agent task sub step reasoning think plan first then next "
    "finally return summary file directory list open read write send message price stock buy "
    "sell ticket flight vehicle engine math add multiply number string true false null ok error "
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma"
).split()
# Words a question asks about; the tool call copies one into its arguments.
_SUBJECTS = (
    "paris london tokyo berlin rome madrid oslo cairo lima delhi apple banana cherry mango lemon "
    "python rust java kotlin linux docker redis postgres alpha beta gamma delta sigma omega river "
    "mountain ocean forest desert planet moon star galaxy comet piano violin guitar drum chess "
    "tennis soccer hockey bitcoin gold silver copper iron carbon oxygen helium einstein newton "
    "darwin tesla curie turing"
).split()
# The tool and parameter names the model is taught. A tool call names the first given tool and
# its first required parameter, but a model this small trained for seconds does not learn to
# copy names from its prompt: it picks a name from these, most often DEFAULT_TOOL (half of the
# training chats give it first). Harnesses that want a greedy tool call of a tool they gave
# should give DEFAULT_TOOL (parameter "query").
TOOL_NAMES = (
    "lookup search web_search calculator add multiply get_weather get_time get_price get_stock_price "
    "read_file write_file list_files send_message send_email translate fetch_news book_flight "
    "open_page run_code create_ticket find_user check_order dispatch"
).split()
DEFAULT_TOOL = "lookup"
PARAM_NAMES = "query city expression path text symbol topic url id name date location".split()
_GENERATION_PROMPT = "<|im_start|>assistant\n"
_LEADS = [
    "What is", "Tell me about", "Please look up", "Find", "Can you check", "I need", "Search for",
    "Give me the", "What do you know about", "Look up", "Get", "Compute", "Send",
]


def chat_template() -> str:
    return resources.files("harnessrl").joinpath("chat_template.jinja").read_text()


def _tool(rng: random.Random, name: str) -> dict:
    params = rng.sample(PARAM_NAMES, rng.choice([1, 1, 2]))
    if name == DEFAULT_TOOL:
        params = ["query"] + [p for p in params if p != "query"][:1]
    props = {p: {"type": "string", "description": f"The {p}."} for p in params}
    if len(params) == 2 and rng.random() < 0.5:
        props[params[1]] = {"type": "integer"}
    desc = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 8))).capitalize() + "."
    return {"type": "function", "function": {"name": name, "description": desc,
                                             "parameters": {"type": "object", "properties": props, "required": params[:1]}}}


def _question(rng: random.Random, subject: str) -> str:
    lead = rng.choice(_LEADS)
    filler = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 4)))
    return f"{lead} {filler + ' ' if filler else ''}{subject}?"


def _assistant(rng: random.Random, thought: str, content: str) -> dict:
    if rng.random() < 0.25:
        return {"role": "assistant", "content": f"<think>\n{thought}\n</think>\n\n{content}"}
    return {"role": "assistant", "content": content}


def _tool_round(rng: random.Random, tools: list[dict]) -> list[dict]:
    """User question, assistant tool call (of the first given tool, with the question's last
    word as its required argument), tool result, assistant answer quoting the result."""
    subject = rng.choice(_SUBJECTS)
    fn = tools[0]["function"]
    call = json.dumps({"name": fn["name"], "arguments": {fn["parameters"]["required"][0]: subject}})
    result = f"{subject} {rng.randint(0, 999)}"
    answer = rng.choice(["The result is {r}.", "It is {r}.", "{r}.", "The answer is {r}."]).format(r=result)
    return [
        {"role": "user", "content": _question(rng, subject)},
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        {"role": "tool", "content": json.dumps({"result": result}) if rng.random() < 0.5 else result},
        _assistant(rng, "The tool answered.", answer),
    ]


def _chats(seed: int, n: int) -> list[tuple[list[dict], list[dict] | None]]:
    """Synthetic (messages, tools) chats: with tools, rounds of question → tool call → result →
    answer; without tools, rounds of question → short answer."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        messages = [{"role": "system", "content": "You are a helpful agent."}] if rng.random() < 0.2 else []
        if rng.random() < 0.8:
            names = rng.sample(TOOL_NAMES, rng.randint(1, 2))
            if rng.random() < 0.5:
                names = [DEFAULT_TOOL] + [n for n in names if n != DEFAULT_TOOL][:1]
            tools = [_tool(rng, name) for name in names]
            for _ in range(rng.choice([1, 1, 2])):
                messages += _tool_round(rng, tools)
            out.append((messages, tools))
        else:
            for _ in range(rng.choice([1, 1, 2])):
                subject = rng.choice(_SUBJECTS)
                answer = rng.choice(["I think it is {s}.", "{S} is the answer.", "It is about {s}."])
                messages += [{"role": "user", "content": _question(rng, subject)},
                             _assistant(rng, "No tool is needed.", answer.format(s=subject, S=subject.capitalize()))]
            out.append((messages, None))
    return out


def _chat_texts(seed: int, n: int) -> list[str]:
    """The chats rendered with the chat template, as the model will see them."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = chat_template()
    return [render_jinja_template(conversations=[messages], tools=tools, chat_template=template)[0][0]
            for messages, tools in _chats(seed, n)]


def build_tokenizer(vocab_size: int = 2048, seed: int = 0):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    # Exactly the pipeline transformers' Qwen2Tokenizer rebuilds when it loads this directory
    # (it ignores a saved pre-tokenizer), so the ids trained on are the ids served.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_chat_texts(seed + 1, 600), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],
    )
    fast.chat_template = chat_template()
    return fast


def _training_batches(tokenizer, seed: int, n: int, batch_size: int):
    """Fixed-order (input_ids, labels) batches of whole chats; the loss is on the assistant turns
    only (their text and the EOS that ends them)."""
    import torch

    texts = _chat_texts(seed, n)
    encodings = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    rows = []
    for full, ids, offsets in zip(texts, encodings["input_ids"], encodings["offset_mapping"]):
        # Each assistant turn follows its generation prompt and ends with EOS (this template
        # renders every prompt as a prefix of the whole chat).
        in_turn = [0] * (len(full) + 1)
        for m in re.finditer(re.escape(_GENERATION_PROMPT), full):
            end = full.index("<|im_end|>", m.end()) + len("<|im_end|>")
            in_turn[m.end():end] = [1] * (end - m.end())
        rows.append((ids, [t if in_turn[start] else -100 for t, (start, _) in zip(ids, offsets)]))
    # Similar lengths share a batch (less padding); the batch order is shuffled with the seed.
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed).shuffle(batches)
    out = []
    for idx in batches:
        width = max(len(rows[i][0]) for i in idx)
        ids = torch.full((len(idx), width), tokenizer.pad_token_id)
        labels = torch.full((len(idx), width), -100)
        for r, i in enumerate(idx):
            ids[r, : len(rows[i][0])] = torch.tensor(rows[i][0])
            labels[r, : len(rows[i][1])] = torch.tensor(rows[i][1])
        out.append((ids, labels))
    return out


_PROBE_TOOLS = [{"type": "function", "function": {
    "name": DEFAULT_TOOL, "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]


def _probes_pass(model, tokenizer) -> bool:
    """The behaviour the imprint is for, checked greedily: a question with DEFAULT_TOOL given gets
    a call of it, a tool result gets a text answer; both end with EOS within 40 tokens."""
    import torch

    def greedy(messages: list[dict]) -> tuple[str, bool]:
        ids = tokenizer.apply_chat_template(messages, tools=_PROBE_TOOLS, add_generation_prompt=True, return_dict=False)
        eos = model.generation_config.eos_token_id
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, eos_token_id=eos,
                                 pad_token_id=tokenizer.pad_token_id)[0, len(ids):].tolist()
        return tokenizer.decode(out[:-1], skip_special_tokens=False), out[-1] in eos

    model.eval()
    try:
        for question in ("What is the capital of france?", "Search for the capital of spain, then answer."):
            text, ended = greedy([{"role": "user", "content": question}])
            calls = tool_calls_in(text)
            if not ended or [c.name for c in calls] != [DEFAULT_TOOL]:
                return False
            call = {"id": "call_0", "type": "function",
                    "function": {"name": calls[0].name, "arguments": calls[0].arguments_json()}}
            result = [{"role": "user", "content": question},
                      {"role": "assistant", "content": BLOCK.sub("", text).strip() or None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "call_0", "content": "Paris 42"}]
            text, ended = greedy(result)
            if not ended or tool_calls_in(text) or not text.strip():
                return False
        return True
    finally:
        model.train()


def _imprint(model, tokenizer, seed: int, steps: int, batch_size: int = 16, lr: float = 5e-3) -> bool:
    """Teach the random model the chat format (tool calls, answers, EOS) with a fixed seeded run;
    from step 60 it stops at the first 20-step mark where the greedy probes pass. Returns whether
    they passed."""
    import torch
    import torch.nn.functional as F

    batches = _training_batches(tokenizer, seed, steps * batch_size, batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.05, 1 - s / steps))
    model.train()
    step = 0
    while step < steps:
        ids, labels = batches[step % len(batches)]
        hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
        targets = labels[:, 1:]
        keep = targets != -100
        # The output layer only on the positions that carry a loss: most of the chat is prompt.
        loss = F.cross_entropy(model.lm_head(hidden[keep]), targets[keep])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step >= 60 and step % 20 == 0 and _probes_pass(model, tokenizer):
            model.eval()
            return True
    model.eval()
    return False


# A shape vLLM's CPU attention serves: it takes head dims 32, 64, 80, ... only (0.32.0), and the
# default shape's is 16. The default stays the smaller model: the test suite trains it many times.
# Its imprint runs a longer schedule (the cap sets the warm-up and decay): with transformers 5.25
# the 300-step one never passed its probes and vLLM's hermes parser saw a broken call.
VLLM_SHAPE = {"hidden_size": 128, "heads": 2, "steps": 600}


def build_tiny_model(out_dir: str | Path, seed: int = 0, hidden_size: int = 64, layers: int = 2,
                     steps: int = 300, heads: int = 4) -> Path:
    """Write tokenizer + tiny imprinted Qwen2 model to `out_dir`; returns the path.
    `steps` caps the imprint (it stops early once its probes pass; a model that never passes them is
    refused with UserError); 0 leaves the weights random.
    The head dim is hidden_size / heads (VLLM_SHAPE: one vLLM serves on CPU)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if heads < 1 or hidden_size % heads:
        raise UserError(f"hidden size {hidden_size} is not a multiple of {heads} heads")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(seed=seed)
    eos_ids = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=min(2, heads),
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # A fixed thread count keeps the float reductions, hence the weights, the same on every run.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id, do_sample=True)
        # A model that fails its own probes breaks every test that reads its tool calls, far
        # from the cause (a new transformers release, a changed shape): say so here instead.
        if steps and not _imprint(model, tokenizer, seed, steps):
            raise UserError(f"the tiny model ({hidden_size} wide, {layers} layers) did not learn its chat format "
                            f"in {steps} steps: its greedy tool-call probes fail")
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
