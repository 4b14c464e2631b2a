"""The "model" of the vLLM stand-in's scripted mode (`vllm_standin.py --scripted`): answers a real
harness like an agent would, from the prompt the harness's request renders to (the tiny model's
Qwen/hermes chat template), so it works the same for chat requests and for the token-id
completions of the proxy's prefix mode.

- A request with tools and no tool result yet: one tool call running SHELL_COMMAND through the
  harness's own shell tool (preceded by a scripted command, e.g. an edit, when the task names one
  of `commands`: (needle, shell line) pairs, the first needle found in the user's turns) (Claude Code's `Bash`, OpenCode's and mini-swe-agent's `bash`, Codex's
  `exec_command` / `shell` / code-mode `exec`, Gemini CLI's `run_shell_command`), or a handoff
  (`transfer_to_*`) first when the harness offers one, or else its first tool with arguments made
  from the schema.
- A tool result back (a tool message, or smolagents' `Observation:` user turn): the shell call
  again while fewer have run than the task's "N times", else mini-swe-agent's finishing command if
  the harness asks for one, else a final answer quoting the tool's output (through smolagents'
  `final_answer` tool where it is offered; the tests look for TOOL_OUTPUT in it, proving the tool ran).
- smolagents' CodeAgent (no tools in the request; its system prompt asks for `<code>` blocks
  calling `final_answer`): the same steps as Python code calling its `bash` tool, each ending
  where its `</code>` stop sequence would have cut it.
- No tools: aider's whole-file listing when it asks for one (applying `replace "A" with "B"` from
  the request), a JSON object for `response_format` (title calls), else a short sentence.
"""

from __future__ import annotations

import json
import re

SHELL_COMMAND = "printf 'hrl-%s\\n' tool-ran"
TOOL_OUTPUT = "hrl-tool-ran"  # what SHELL_COMMAND prints, and no request holds before it ran
MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_THINK = "<think>\nI will run a command and report what it prints.\n</think>\n\n"


def _turns(prompt: str) -> list[tuple[str, str]]:
    """(role, text) of each rendered message, the generation prompt's empty assistant turn left out."""
    turns = []
    for part in prompt.split("<|im_start|>")[1:]:
        role, _, text = part.partition("\n")
        turns.append((role, text.split("<|im_end|>")[0]))
    if turns and turns[-1][0] == "assistant" and not turns[-1][1].strip():
        turns.pop()
    return turns


def _tools(prompt: str) -> list[dict]:
    block = re.search(r"<tools>\n(.*?)\n?</tools>", prompt, re.S)
    if not block:
        return []
    return [json.loads(line) for line in block.group(1).splitlines() if line.strip()]


def _short(name: str) -> str:
    """A tool's own name, without the namespace a surface may have put before it."""
    return re.split(r"[.]|__", name)[-1]


def _call(name: str, arguments: dict) -> str:
    return f"{_THINK}<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _string_params(tool: dict) -> list[str]:
    props = (tool.get("parameters") or {}).get("properties") or {}
    return [k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"]


def _command(turns: list[tuple[str, str]], commands: tuple[tuple[str, str], ...]) -> str:
    """SHELL_COMMAND, after the scripted command of the first needle the user's turns hold (the
    marker still printed last, so the answer and mini-swe-agent's submit work as without one)."""
    asked = "\n".join(text for role, text in turns if role == "user")
    scripted = next((command for needle, command in commands if needle in asked), None)
    return f"{scripted}\n{SHELL_COMMAND}" if scripted else SHELL_COMMAND  # a line of its own: it may end a here-document


def _shell_call(tools: list[dict], command: str) -> str | None:
    by_name = {_short(t.get("name", "")): t for t in tools}
    if (t := by_name.get("Bash")) or (t := by_name.get("bash")) or (t := by_name.get("run_shell_command")):
        args = {"command": command}
        if "description" in ((t.get("parameters") or {}).get("required") or []):
            args["description"] = "Print a marker"  # OpenCode's bash requires it
        return _call(t["name"], args)
    if t := by_name.get("exec_command"):
        return _call(t["name"], {"cmd": command})
    if t := by_name.get("shell"):
        return _call(t["name"], {"command": ["bash", "-lc", command]})
    if (t := by_name.get("exec")) and _string_params(t):  # Codex's code mode: JavaScript calling its shell tool
        code = f"const r = await tools.exec_command({{cmd: {json.dumps(command)}}});\ntext(r);"
        return _call(t["name"], {_string_params(t)[0]: code})
    return None


def _from_schema(schema: dict) -> object:
    """A small value that satisfies a JSON schema (the kinds harnesses use for arguments and titles)."""
    kind = str(schema.get("type") or "").lower()  # Gemini's schema dialect writes OBJECT, INTEGER, ...
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: _from_schema(props.get(k) or {}) for k in (schema.get("required") or list(props))}
    if kind == "array":
        return [_from_schema(schema.get("items") or {})]
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    return "hrl"


def _last_call_name(turns: list[tuple[str, str]]) -> str | None:
    for role, text in reversed(turns):
        if role == "assistant":
            calls = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.S)
            try:
                return json.loads(calls[-1]).get("name") if calls else None
            except ValueError:  # a harness may send back a call whose arguments are not JSON
                return None
    return None


def _aider_listing(turns: list[tuple[str, str]]) -> str:
    """The file aider added to the chat, whole, with the request's `replace "A" with "B"` applied."""
    files = [t for r, t in turns if r == "user" and "*added these files to the chat*" in t]
    match = re.search(r"\n\n(\S+)\n```\n(.*?)```", files[-1], re.S) if files else None
    if not match:
        return "There is no file in the chat to edit."
    name, content = match.groups()
    for old, new in re.findall(r'replace "([^"]+)" with "([^"]+)"', turns[-1][1]):
        content = content.replace(old, new)
    return f"I will make the change.\n\n{name}\n```\n{content}```\n"


def _observation(text: str) -> str | None:
    """What a smolagents `Observation:` turn reports (CodeAgent's execution logs alone)."""
    if not text.startswith("Observation:"):
        return None
    text = text.removeprefix("Observation:").strip()
    return text.removeprefix("Execution logs:").split("Last output from code snippet:")[0].strip()


def _runs_wanted(turns: list[tuple[str, str]]) -> int:
    """How many times the user's first turn asks the command to run ("... 4 times ..."; else once)."""
    first = next((text for role, text in turns if role == "user"), "")
    found = re.search(r"\b(\d+) times\b", first)
    return int(found.group(1)) if found else 1


def _code_agent(turns: list[tuple[str, str]], latest: str, commands: tuple[tuple[str, str], ...]) -> str:
    """smolagents' CodeAgent: Python calling its `bash` tool, then `final_answer`."""
    observed = [o for role, text in turns if role == "user" and (o := _observation(text)) is not None]
    if not observed or (len(observed) < _runs_wanted(turns) and _observation(latest.strip()) is not None):
        code = f"print(bash(command={json.dumps(_command(turns, commands))}))"
    else:
        code = f"final_answer({json.dumps('The command printed: ' + observed[-1][:300])})"
    return f"{_THINK}Thought: I run it and report.\n<code>\n{code}\n"  # `</code>` is its stop sequence


def answer(prompt: str, response_format: dict | None = None, commands: tuple[tuple[str, str], ...] = ()) -> str:
    """The reply text (hermes tool calls in it) to a rendered prompt."""
    turns, tools = _turns(prompt), _tools(prompt)
    if response_format and response_format.get("type") in ("json_schema", "json_object"):
        schema = (response_format.get("json_schema") or {}).get("schema") or {"type": "object"}
        return json.dumps(_from_schema(schema))
    # what came after the model's last turn (a harness may add a user note after the tool results)
    since = len(turns) - next((i for i, (role, _) in enumerate(reversed(turns)) if role == "assistant"), len(turns))
    latest = "\n".join(text for _, text in turns[since:])
    system = turns[0][1] if turns and turns[0][0] == "system" else ""
    if not tools and "<code>" in system and "final_answer" in system:
        return _code_agent(turns, latest, commands)
    observations = [o for role, text in turns[since:] if role == "user" and (o := _observation(text)) is not None]
    if tools:
        handoffs = [t for t in tools if _short(t.get("name", "")).startswith("transfer_to_")]
        called = _short(_last_call_name(turns) or "")
        ran = prompt.count("<tool_response>") + sum(_observation(text) is not None for role, text in turns)
        result = "<tool_response>" in latest or observations
        if not result or called.startswith("transfer_to_") or ran < _runs_wanted(turns):
            others = [t for t in tools if t not in handoffs]
            if handoffs and not called.startswith("transfer_to_"):
                return _call(handoffs[0]["name"], {})
            if shell := _shell_call(others, _command(turns, commands)):
                return shell
            if others:
                return _call(others[0]["name"], _from_schema(others[0].get("parameters") or {}))
        outputs = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", latest, re.S) + observations
        output = outputs[-1].strip() if outputs else ""
        if "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in prompt and called == "bash" and TOOL_OUTPUT in output:
            return _call("bash", {"command": MINI_SUBMIT})  # mini-swe-agent ends on this command's output
        if any(_short(t.get("name", "")) == "final_answer" for t in tools):  # smolagents' ToolCallingAgent
            return _call("final_answer", {"answer": f"The command printed: {output[:300]}"})
        return f"{_THINK}The command printed: {output[:300]}"
    if "*file listing*" in prompt:
        return _aider_listing(turns)
    return "Done."
