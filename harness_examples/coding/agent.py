"""The built-in coding agent: a minimal harness on the OpenAI SDK with bash / read_file /
write_file / edit tools, working in its current directory (the rollout's workspace).

    python -m harnessrl.harness_examples.coding.agent TASK_JSON [--max-turns N] [--max-tokens N]

TASK_JSON is the `{task}` file of `harnessrl loop --cmd` (its "input" is the task statement).
The base URL and key come from OPENAI_BASE_URL / OPENAI_API_KEY, which `harnessrl run` and
`loop --cmd` set to the rollout's; the sampling temperature from HARNESSRL_TEMPERATURE.

Exit status: 0 whenever the episode ended as an episode — an answer, the turn limit, a prompt
that outgrew the context, a model that called no tool or called one wrongly (tool errors go back
to the model as text). Whether the work is right is for the hidden tests to say; a non-zero
status means the rollout itself failed (bad task file, proxy unreachable or refusing), which the
loop records as a failed rollout rather than a zero reward.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import typer

from harnessrl.errors import UserError
from harnessrl.harness_examples.chat import (EpisodeStopped, ToolCall, chat, make_client, resolve_model, run_tool,
                                             tool_message)

SYSTEM = """You are a coding agent working in a Python repository: the current directory.
Do the task you are given by reading and changing the code with your tools:
- bash: run a shell command in the repository (e.g. `ls`, `python -m pytest -q`);
- read_file: read a file;
- write_file: create or overwrite a file;
- edit: replace one exact, unique snippet of a file by another.
Check your change by running the tests. When you are done, reply with a short summary and no tool call."""

UNPARSABLE = ("Error: the tool call in your reply could not be parsed. Write it as <tool_call>{\"name\": TOOL, "
              "\"arguments\": {...}}</tool_call>, or reply without one when you are done.")
OUTPUT_LIMIT = 8000  # characters of a tool result the model sees: a flood of output would fill its context
_HEAD = 2000  # of those, from the start (the command's first lines); the rest from the end (the verdict)


def _param(kind: str, text: str) -> dict:
    return {"type": kind, "description": text}


def _schema(name: str, description: str, params: dict[str, dict]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": params, "required": list(params)}}}


TOOLS = [
    _schema("bash", "Run a bash command in the repository; returns its output and exit code.",
            {"command": _param("string", "The command line.")}),
    _schema("read_file", "Read a text file.", {"path": _param("string", "Path relative to the repository.")}),
    _schema("write_file", "Create or overwrite a text file.",
            {"path": _param("string", "Path relative to the repository."),
             "content": _param("string", "The whole new content.")}),
    _schema("edit", "Replace old_str, which must occur exactly once in the file, by new_str.",
            {"path": _param("string", "Path relative to the repository."),
             "old_str": _param("string", "The exact text to replace (unique in the file)."),
             "new_str": _param("string", "The replacement text.")}),
]


def clip(text: str, limit: int = OUTPUT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    tail = limit - _HEAD
    return f"{text[:_HEAD]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


class Tools:
    """The agent's tools over one working directory. Failures are ValueErrors, which
    `chat.run_tool` hands back to the model as "Error: …" rather than ending the episode."""

    def __init__(self, root: Path, command_timeout: float) -> None:
        self.root = root
        self.command_timeout = command_timeout

    def table(self) -> dict:
        return {"bash": self.bash, "read_file": self.read_file, "write_file": self.write_file, "edit": self.edit}

    def _path(self, path: str) -> Path:
        if not isinstance(path, str) or not path.strip():
            raise ValueError("path must be a non-empty string")
        return self.root / path  # an absolute path stays absolute; the sandbox, not the agent, bounds it

    def _read(self, path: str) -> tuple[Path, str]:
        p = self._path(path)
        try:
            return p, p.read_text()
        except UnicodeDecodeError:
            raise ValueError(f"{path} is not a UTF-8 text file") from None
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror}") from None

    def _write(self, p: Path, path: str, content: str) -> None:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content)
        except OSError as exc:
            raise ValueError(f"cannot write {path}: {exc.strerror}") from None

    def bash(self, command: str) -> str:
        if not isinstance(command, str) or not command.strip():
            raise ValueError("command must be a non-empty string")
        # its own session, so that a timeout kills whatever the command started too
        proc = subprocess.Popen(["bash", "-c", command], cwd=self.root, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=self.command_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return f"{clip(out.decode(errors='replace'))}\n[killed after {self.command_timeout:g} s]"
        return f"{clip(out.decode(errors='replace'))}\n[exit code {proc.returncode}]"

    def read_file(self, path: str) -> str:
        _, text = self._read(path)
        return clip(text) if text else f"({path} is empty)"

    def write_file(self, path: str, content: str) -> str:
        if not isinstance(content, str):
            raise ValueError("content must be a string")
        self._write(self._path(path), path, content)
        return f"wrote {len(content)} characters to {path}"

    def edit(self, path: str, old_str: str, new_str: str) -> str:
        if not isinstance(old_str, str) or not old_str or not isinstance(new_str, str):
            raise ValueError("old_str must be a non-empty string and new_str a string")
        p, text = self._read(path)
        found = text.count(old_str)
        if found != 1:
            raise ValueError(f"old_str occurs {found} times in {path}; it must occur exactly once "
                             "(copy it exactly, with enough context to be unique)")
        self._write(p, path, text.replace(old_str, new_str))
        return f"edited {path}"


def statement(task_file: Path) -> str:
    """The task statement of a `{task}` JSON file."""
    try:
        task = json.loads(task_file.read_text())
    except OSError as exc:
        raise UserError(f"cannot read the task file {task_file}: {exc.strerror}") from None
    except ValueError:
        raise UserError(f"{task_file} is not JSON (want the {{task}} file of loop --cmd: {{\"input\": ...}})") from None
    text = task.get("input") if isinstance(task, dict) else None
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{task_file}: no task statement (a non-empty string \"input\")")
    return text


def run_agent(client: openai.OpenAI, model: str | None, task: str, tools: Tools, *, max_turns: int,
              max_tokens: int, temperature: float, log=sys.stderr) -> dict:
    """One episode. Returns how it went: {"stopped": answer | max-turns | context, "answer",
    "model_calls", "tool_calls", "tool_errors"}."""
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    report = {"stopped": "max-turns", "answer": "", "model_calls": 0, "tool_calls": 0, "tool_errors": 0}
    table = tools.table()
    model = resolve_model(client, model)
    for _ in range(max_turns):
        report["model_calls"] += 1
        try:
            turn = chat(client, model, messages, TOOLS, max_tokens=max_tokens, temperature=temperature)
        except EpisodeStopped as exc:  # the prompt outgrew the context, or the like: the episode ends here
            print(f"[agent] stopped: {str(exc)[:300]}", file=log)
            return {**report, "stopped": "context"}
        messages.append(turn.message)
        if not turn.tool_calls and "<tool_call>" in turn.content:
            # a call the server's tool parser could not read stays in the text: say so, as for a bad tool call
            report["tool_errors"] += 1
            print(f"[agent] unparsable tool call: {turn.content[:200]!r}", file=log)
            messages.append({"role": "user", "content": UNPARSABLE})
            continue
        if not turn.tool_calls:
            return {**report, "stopped": "answer", "answer": turn.content}
        for call in turn.tool_calls:
            result, ok = run_tool(call, table)
            report["tool_calls"] += 1
            report["tool_errors"] += not ok
            print(f"[agent] {_describe(call)} -> {'ok' if ok else 'error'}: {result[:200]!r}", file=log)
            messages.append(tool_message(call, result))
    return report


def _describe(call: ToolCall) -> str:
    return f"{call.name or '?'}({call.raw_arguments[:120]})"


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def agent(
    task_file: Path = typer.Argument(..., help="The task JSON ({task} of loop --cmd): its \"input\" is the statement."),
    max_turns: int = typer.Option(20, min=1, help="Model replies before the episode ends."),
    max_tokens: int = typer.Option(1024, min=1, help="Tokens per model reply."),
    model: str = typer.Option("", help="Model name to ask for (default: the one the proxy serves)."),
    temperature: float = typer.Option(None, help="Sampling temperature (default: $HARNESSRL_TEMPERATURE, else 1)."),
    command_timeout: float = typer.Option(120.0, min=1, help="Seconds one bash command may run."),
) -> None:
    """Work on a coding task in the current directory, through the proxy at $OPENAI_BASE_URL."""
    task = statement(task_file)
    if not os.environ.get("OPENAI_BASE_URL"):
        raise UserError("OPENAI_BASE_URL is not set (run me under harnessrl run / loop --cmd, or set it)")
    if temperature is None:
        try:
            temperature = float(os.environ.get("HARNESSRL_TEMPERATURE", "1"))
        except ValueError:
            raise UserError("HARNESSRL_TEMPERATURE is not a number") from None
    client = make_client(os.environ["OPENAI_BASE_URL"], os.environ.get("OPENAI_API_KEY") or "none")
    with client:
        report = run_agent(client, model or None, task, Tools(Path.cwd(), command_timeout), max_turns=max_turns,
                           max_tokens=max_tokens, temperature=temperature)
    print(report.pop("answer"))
    print(json.dumps(report))  # the last line: how the episode ended, for the rollout's log


def main() -> None:
    try:
        app()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except openai.APIConnectionError as exc:
        print(f"error: cannot reach the proxy at {os.environ.get('OPENAI_BASE_URL')} ({exc})", file=sys.stderr)
        sys.exit(2)
    except openai.APIStatusError as exc:  # a refused call (a finished rollout's 410, a 5xx): the rollout failed
        print(f"error: the proxy answered {exc.status_code}: {str(exc)[:300]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
