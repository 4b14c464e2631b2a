"""Everyday-assistant tasks: a tool choice and its argument, asked in real language.

Nine tools over three kinds of thing — cities (weather, local time, population), products
(price, reviews, stock), people (email, phone, birthday) — and real names of each. A task is a
question such as "Is it raining in Lisbon right now?": the right tool (the action) called with
the thing it names (the args). Each entity is asked about with some of its kind's tools in
training and with the others held out, and every tool is asked in several phrasings, so the
held-out tasks are combinations of a tool and a name never trained on, in words the model has
seen. Generated offline and deterministically from a seed.

It is the tiny toolbox's idea for a model that reads English: where the toolbox's items and
attributes are made up, a pretrained instruct model brings what "Is it raining" and "How many
people live" mean, and RL is left the part it does not already do reliably (SmolLM2-135M picks
a plausible but wrong tool, or writes the argument in its own words).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = {
    "city": ("city", "Lisbon Tokyo Nairobi Toronto Madrid Sydney Cairo Berlin Mumbai Lima Oslo Seoul".split()),
    "product": ("product", ["Kindle Paperwhite", "AirPods Pro", "Nintendo Switch", "Instant Pot", "Dyson V15",
                            "GoPro Hero", "Fitbit Charge", "Roomba", "Sonos One", "Pixel Watch", "Echo Dot",
                            "iPad Mini"]),
    "person": ("name", ["Maria Garcia", "James Smith", "Aiko Tanaka", "Ahmed Hassan", "Olga Petrova",
                        "Liam O'Brien", "Priya Patel", "Chen Wei", "Sofia Rossi", "Lucas Silva", "Emma Johnson",
                        "Kwame Mensah"]),
}
# tool → (kind, description, phrasings of the question: {x} is the entity)
TOOLS_SPEC = {
    "get_weather": ("city", "Get the current weather in a city.", [
        "What's the weather like in {x} today?", "Is it raining in {x} right now?",
        "Should I bring a jacket in {x} today?"]),
    "get_local_time": ("city", "Get the current local time in a city.", [
        "What time is it in {x} right now?", "Is it morning or evening in {x} now?",
        "What's the current time in {x}?"]),
    "get_population": ("city", "Get the number of people living in a city.", [
        "How many people live in {x}?", "What is the population of {x}?", "How big is {x} by population?"]),
    "get_price": ("product", "Get the current price of a product.", [
        "How much does the {x} cost?", "What's the price of the {x}?", "Is the {x} expensive right now?"]),
    "get_reviews": ("product", "Get the average customer review of a product.", [
        "What do customers think of the {x}?", "How well is the {x} rated?", "Are the {x} reviews any good?"]),
    "check_stock": ("product", "Check whether a product is in stock.", [
        "Is the {x} in stock?", "Can I buy the {x} today, or is it sold out?", "Do you have the {x} available?"]),
    "get_email": ("person", "Look up a person's email address.", [
        "What is {x}'s email address?", "How can I email {x}?", "Find the email of {x}."]),
    "get_phone": ("person", "Look up a person's phone number.", [
        "What is {x}'s phone number?", "How do I call {x}?", "Find the phone number of {x}."]),
    "get_birthday": ("person", "Look up a person's birthday.", [
        "When is {x}'s birthday?", "What day was {x} born?", "When should I wish {x} a happy birthday?"]),
}
# one worked call in the instructions shows the answer's form (a tool of the list, so the form is
# all it gives away); which tool and what argument stay to be learned
SYSTEM = ("You are a helpful assistant. Answer the user's question by calling exactly one of the tools. "
          "For example, to answer \"Is it sunny in Rome?\" you reply:\n<tool_call>\n"
          "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>")


def tool_schema(name: str) -> dict[str, Any]:
    kind, description, _ = TOOLS_SPEC[name]
    param = KINDS[kind][0]
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {param: {"type": "string"}}, "required": [param]}}}


TOOLS = [tool_schema(name) for name in TOOLS_SPEC]


def normalise(value: Any) -> str:
    """An argument as compared: case, surrounding space and a leading "the" do not matter."""
    text = " ".join(str(value).split()).casefold()
    return text[4:] if text.startswith("the ") else text


@dataclass(frozen=True)
class AssistantTask:
    id: str
    tool: str
    entity: str
    phrasing: int

    @property
    def param(self) -> str:
        return KINDS[TOOLS_SPEC[self.tool][0]][0]

    @property
    def question(self) -> str:
        return TOOLS_SPEC[self.tool][2][self.phrasing].format(x=self.entity)

    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": self.question}]

    def right(self, name: str | None, args: dict[str, Any] | None) -> tuple[bool, bool]:
        """(right tool, right argument) of a call."""
        value = (args or {}).get(self.param)
        return name == self.tool, value is not None and normalise(value) == normalise(self.entity)

    def row(self) -> dict[str, Any]:
        args = {self.param: self.entity}
        call = {"id": "call_0", "type": "function", "function": {"name": self.tool, "arguments": json.dumps(args)}}
        return {"id": self.id, "input": self.messages(), "reference": self.entity,
                "reference_calls": [{"name": self.tool, "arguments": args}],
                "expert_trace": [{"role": "assistant", "content": "", "tool_calls": [call]},
                                 {"role": "tool", "tool_call_id": "call_0", "content": result(self.tool, self.entity)}],
                "tools": TOOLS, "meta": {"harness": "assistant", "tool": self.tool, "entity": self.entity,
                                         "phrasing": self.phrasing}}


# a cycle within each kind: the tool an inconsistent expert calls instead of the asked one
CONFUSE = {"get_weather": "get_local_time", "get_local_time": "get_population", "get_population": "get_weather",
           "get_price": "get_reviews", "get_reviews": "check_stock", "check_stock": "get_price",
           "get_email": "get_phone", "get_phone": "get_birthday", "get_birthday": "get_email"}


def inconsistent_expert(tasks: list[AssistantTask], traces: int = 5, right: int = 2) -> list[dict[str, Any]]:
    """SFT lines of an expert that mixes up tools, as the toolbox's (harness_examples/toolbox/tasks.py):
    `traces` lines a task, `right` of them calling the asked tool and the others CONFUSE's, each with
    the right argument and that tool's result. Fitted on it, a model's greedy choice is the confused
    tool and its sampled one right about `right/traces` of the time: what RL lifts."""
    if not 0 <= right <= traces:
        raise ValueError("0 ≤ right ≤ traces")
    rows = []
    for t in tasks:
        for k in range(traces):
            called = AssistantTask(t.id, t.tool if k < right else CONFUSE[t.tool], t.entity, t.phrasing)
            rows.append({**t.row(), "expert_trace": called.row()["expert_trace"]})
    return rows


def result(tool: str, entity: str) -> str:
    """What a tool returns: made up, but the same for the same call (it is not what is rewarded)."""
    rng = random.Random(f"{tool}:{entity}")
    return {"get_weather": lambda: f"{rng.choice(['sunny', 'cloudy', 'rain', 'windy'])}, {rng.randint(-5, 35)} °C",
            "get_local_time": lambda: f"{rng.randint(0, 23):02d}:{rng.choice([0, 15, 30, 45]):02d}",
            "get_population": lambda: f"{rng.randint(3, 400) / 10:.1f} million",
            "get_price": lambda: f"${rng.randint(29, 499)}.99",
            "get_reviews": lambda: f"{rng.randint(30, 50) / 10:.1f} of 5 stars",
            "check_stock": lambda: rng.choice(["in stock", "sold out", "3 left"]),
            "get_email": lambda: entity.split()[0].lower() + "@example.com",
            "get_phone": lambda: f"+1 555 {rng.randint(1000, 9999)}",
            "get_birthday": lambda: f"{rng.randint(1, 28)} {rng.choice(['March', 'July', 'October'])}"}[tool]()


def generate(seed: int = 0) -> tuple[list[AssistantTask], list[AssistantTask]]:
    """(training, held-out) tasks: each entity with two of its kind's three tools in training and
    the third held out; each (tool, entity) in one phrasing of the three, drawn by the seed.
    72 training and 36 held-out tasks."""
    rng = random.Random(f"assistant-split-{seed}")
    train, held = [], []
    for kind, (_, entities) in KINDS.items():
        tools = [t for t, spec in TOOLS_SPEC.items() if spec[0] == kind]
        for entity in entities:
            order = tools[:]
            rng.shuffle(order)
            for side, chosen in ((train, order[:2]), (held, order[2:])):
                for tool in chosen:
                    k = rng.randrange(3)
                    side.append(AssistantTask(f"assistant-{tool}-{entity.replace(' ', '_')}", tool, entity, k))
    rng.shuffle(train)
    rng.shuffle(held)
    return train, held


def write(tasks: list[AssistantTask], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(t.row()) + "\n" for t in tasks))
    return path


def read(path: str | Path) -> list[AssistantTask]:
    out = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            m = r["meta"]
            out.append(AssistantTask(r["id"], m["tool"], m["entity"], int(m["phrasing"])))
    return out
