"""`harnessrl demo`'s settings, apart from `demo.py` so that the CLI reads its defaults without
importing torch. Two recipes: the real model's (the default) and the tiny model's (`--tiny`: the
fast run, and the tests'). Measured in docs/changelog.md (issue 41: the tiny demo; issue 52: the
real one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    name: str
    harness: str  # the family: its 16 training and 16 held-out tasks
    algo: str
    rounds: int
    sft_steps: int  # warm-start SFT steps on an inconsistent expert (batch 8)
    sft_lr: float
    group: int  # rollouts per training task per round
    batch: int  # samples per optimizer step: every rollout once a round
    lr: float
    temperature: float
    threads: int  # torch threads
    budget: int | None  # --max-tokens-per-microbatch (None: the trainer's default)
    action: str  # what the summary calls the two skills
    args: str


TINY = Recipe(
    "tiny", "toolbox",
    algo="capo",  # the project's own method (Harness-RL's CAPO)
    rounds=3, sft_steps=600, sft_lr=1e-3,  # from the untrained tiny model (no imprint)
    group=8, batch=32, lr=2e-4, temperature=0.7,
    # one thread: the tiny model's ops are too small for a second one to pay, and with any other work
    # on the 2 cores two threads contend (measured: 2:12 with one thread, 8:30 with two; docs/changelog.md)
    threads=1, budget=None,
    action="the asked attribute's tool (action)", args="the item as its argument (args)")
REAL = Recipe(
    "smollm2", "assistant",
    algo="grpo",  # capo's partition probe would cost a round's time on this model and machine
    rounds=2, sft_steps=20, sft_lr=5e-5,
    group=4, batch=32, lr=2e-5, temperature=1.0,
    threads=2,
    # a step's 32 samples hold about 24k tokens but share the family's 650-token prompt and tools:
    # computed once, the step computes about 3k, so one micro-batch (the default budget, 4,096 tokens
    # counted whole, split it into 7, each computing the prompt again: 36 s a step against 10)
    budget=32768,
    action="the asked tool (action)", args="the name or place as its argument (args)")

# the tiny recipe's toolbox world and expert
ITEMS = 8  # the toolbox world's first 8 items: 16 training tasks, 16 held out (each item's other two attributes)
CONFUSE = {"color": "size", "size": "owner", "owner": "city", "city": "color"}  # the expert's cycle, as the bench's
DRILL = 3  # times the copy drill (find(item), two phrasings) is in the warm start's data
# both recipes: 16 training and 16 held-out tasks; expert lines a training task, and how many call the right tool
TASKS, TRACES, RIGHT = 16, 5, 2
