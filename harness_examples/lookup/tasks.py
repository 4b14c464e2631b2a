"""Lookup tasks, generated deterministically: each asks for the value stored under a key; the
`lookup` tool serves the key→value table of the whole task file. Tasks are written in the
`harnessrl tasks import` JSONL format, with the reference call and an expert trace."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.errors import UserError

SYSTEM = "Use the lookup tool to find the value stored under the key, then reply with <answer>the value</answer>."
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Return the value stored under a key.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
_KEYS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
         "river city country book author company planner worker engine ticket flight vehicle stock price "
         "message file directory number string search result answer question summary").split()
# One-word values: a policy that cannot yet copy the tool's answer still guesses right one time in
# len(_VALUES), so the reward has variance for RL from the start.
_VALUES = "red blue green amber violet silver golden black white orange".split()


@dataclass
class LookupTask:
    id: str
    key: str
    value: str

    @property
    def question(self) -> str:
        return f'What value is stored under the key "{self.key}"?'

    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": self.question}]

    def expert_trace(self) -> list[dict[str, Any]]:
        call = {"id": "call_0", "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"query": self.key})}}
        return [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": self.value},
            {"role": "assistant", "content": f"<answer>{self.value}</answer>"},
        ]

    def row(self) -> dict[str, Any]:
        return {"id": self.id, "input": self.messages(), "reference": self.value,
                "reference_calls": [{"name": "lookup", "arguments": {"query": self.key}}],
                "expert_trace": self.expert_trace(), "tools": [LOOKUP_TOOL], "meta": {"harness": "lookup", "key": self.key}}


def generate(n: int, seed: int = 0, prefix: str = "lookup") -> list[LookupTask]:
    """n tasks over distinct keys (n ≤ the key vocabulary), each with a random value."""
    rng = random.Random(seed)
    if n > len(_KEYS):
        raise UserError(f"at most {len(_KEYS)} lookup tasks can be generated, asked for {n}")
    keys = rng.sample(_KEYS, n)
    return [LookupTask(f"{prefix}-{i}", k, rng.choice(_VALUES)) for i, k in enumerate(keys)]


def write(tasks: list[LookupTask], path: str | Path) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(t.row()) + "\n" for t in tasks))
    return path


def read(path: str | Path) -> list[LookupTask]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"lookup task file not found: {path}")
    tasks = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            tasks.append(LookupTask(str(row["id"]), str(row["meta"]["key"]), str(row["reference"])))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise UserError(f"{path}:{n}: not a lookup task line ({exc})") from None
    return tasks
