"""Whether a chat template renders a request's tools.

Many chat templates ignore `tools` (SmolLM2-Instruct's own does): rendered with one, a request
with tools becomes a prompt without them, the model answers in prose, and a recording proxy
would store training data for a prompt the harness never asked for. Every place that renders a
chat with tools (the proxy's token route, `harnessrl vllm`, sft, compile's re-render) asks this
once per template and refuses, naming the fix, where the answer is no.
"""

from __future__ import annotations

from collections.abc import Callable

# two tools with names no template writes by itself: a template that renders only the first
# tool, or none, is caught
_NAMES = ("harnessrl_probe_weather_q7", "harnessrl_probe_clock_k3")
PROBE_TOOLS = [
    {"type": "function", "function": {
        "name": name, "description": "A probe tool.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    for name in _NAMES
]
PROBE_MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
FIX = ("give it a chat template that renders tools (`harnessrl smollm2 DIR` writes SmolLM2 with one; "
       "or set `chat_template` in the model's tokenizer_config.json to a Hermes-style template)")


def renders_tools(render_text: Callable[[list[dict], list[dict]], str]) -> bool:
    """`render_text(messages, tools)` → the prompt text; True when every probe tool's name is in it."""
    try:
        text = render_text(PROBE_MESSAGES, PROBE_TOOLS)
    except Exception:  # a template that raises on tools renders none of them
        return False
    return all(name in text for name in _NAMES)


def template_renders_tools(tokenizer) -> bool:
    """The same check for a Hugging Face tokenizer's own chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    return renders_tools(lambda messages, tools: tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True))


def dropped_tools_message(model: str) -> str:
    return f"the chat template of model {model} renders no tools, so a request's tools would be dropped: {FIX}"
