"""The harness registry: every `loop --harness` name, its task source and how one rollout runs.

An entry turns the loop's task options into a `HarnessTasks`: the training and held-out tasks,
a runner with one signature for every harness, and the tasks file (references, expert traces)
the compiler imports. `--harness module:function` plugs in a user's own harness (see
`user_harness`). To add an example harness, write its loader here and add it to `HARNESSES`.
Loaders import their harness when called, so the registry (and `harnessrl --help`) stays light.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.errors import UserError
from harnessrl.plugins import load_function

DEFAULT_N_TASKS = 8
# (proxy url, task, group id, run tag, temperature) → harness_examples.chat.RolloutResult
Runner = Callable[[str, Any, str, str, float], Any]


@dataclass
class TaskSource:
    """The loop's options that choose tasks."""
    tasks: Path | None  # the harness's task file; None: generated tasks where the harness has them
    corpus: Path | None  # search harnesses: a real corpus JSONL beside a real QA tasks file
    out: Path  # where a generated tasks file is written
    n_tasks: int | None  # None: the harness's own count (DEFAULT_N_TASKS, or a family's by construction)
    eval_fraction: float
    seed: int

    @property
    def count(self) -> int:
        return DEFAULT_N_TASKS if self.n_tasks is None else self.n_tasks


@dataclass
class HarnessTasks:
    train: list[Any]
    eval: list[Any]
    run: Runner
    task_id: Callable[[Any], str]
    tasks_file: Path | None = None  # `harnessrl tasks import` JSONL with references / expert traces
    # what the harness needs for as long as the loop's proxy runs (entered with its URL): `loop --cmd --intercept`'s mitmdump
    around: Callable[[str], AbstractContextManager] | None = None


@dataclass(frozen=True)
class Harness:
    name: str
    summary: str
    load: Callable[[TaskSource], HarnessTasks]


def split_tasks(tasks: list[Any], eval_fraction: float) -> tuple[list[Any], list[Any]]:
    n_eval = max(1, round(len(tasks) * eval_fraction)) if len(tasks) > 1 else 0
    return tasks[: len(tasks) - n_eval], tasks[len(tasks) - n_eval:]


def first_tasks(train: list[Any], held: list[Any], src: TaskSource) -> tuple[list[Any], list[Any]]:
    """A family split by construction cut to `--n-tasks` tasks in all, `--eval-fraction` of them
    held out (each side its first ones): the option is honoured, never ignored."""
    if src.n_tasks is None:
        return train, held
    if src.n_tasks < 2:
        raise UserError(f"--n-tasks {src.n_tasks}: this harness needs at least 2 (one to train, one held out)")
    n_eval = min(max(1, round(src.n_tasks * src.eval_fraction)), src.n_tasks - 1)
    if src.n_tasks - n_eval > len(train) or n_eval > len(held):
        raise UserError(f"--n-tasks {src.n_tasks} with --eval-fraction {src.eval_fraction}: this harness has "
                        f"{len(train)} training and {len(held)} held-out tasks")
    return train[: src.n_tasks - n_eval], held[:n_eval]


def _lookup(src: TaskSource) -> HarnessTasks:
    from harnessrl.harness_examples.lookup import harness as lookup
    from harnessrl.harness_examples.lookup import tasks as lookup_tasks

    all_tasks = lookup_tasks.read(src.tasks)[: src.n_tasks] if src.tasks else lookup_tasks.generate(src.count, src.seed)
    table = {t.key: t.value for t in all_tasks}
    train, held = split_tasks(all_tasks, src.eval_fraction)

    def run(url, task, group_id, run_tag, temperature):
        return lookup.run_rollout(url, table, task, lookup.LookupConfig(temperature=temperature),
                                  group_id=group_id, run=run_tag)

    return HarnessTasks(train, held, run, lambda t: t.id, lookup_tasks.write(all_tasks, src.out / "tasks.jsonl"))


def _toolbox(delegate: bool) -> Callable[[TaskSource], HarnessTasks]:
    """64 training and 64 held-out toolbox tasks of the seed's world (split by construction;
    `--n-tasks` takes the first of each side, `--tasks` reads a written file).
    Training rounds draw a fresh world per round (`tasks.training_world`)."""
    def load(src: TaskSource) -> HarnessTasks:
        from harnessrl.harness_examples.toolbox import harness as toolbox
        from harnessrl.harness_examples.toolbox import tasks as toolbox_tasks

        if src.tasks:
            all_tasks = toolbox_tasks.read(src.tasks)[: src.n_tasks]
            train, held = split_tasks(all_tasks, src.eval_fraction)
        else:
            train, held = first_tasks(*toolbox_tasks.generate(src.seed, delegate), src)
        held_out = toolbox_tasks.world(src.seed)
        eval_ids = {t.id for t in held}

        def run(url, task, group_id, run_tag, temperature):
            # training rounds see a fresh world each; evaluation (and held-out tasks) the seed's
            table = held_out if task.id in eval_ids or run_tag.startswith("eval") else \
                toolbox_tasks.training_world(src.seed, run_tag)
            return toolbox.run_rollout(url, table, task, toolbox.ToolboxConfig(temperature=temperature),
                                       group_id=group_id, run=run_tag)

        return HarnessTasks(train, held, run, lambda t: t.id, toolbox_tasks.write(train + held, src.out / "tasks.jsonl"))

    return load


def _assistant(src: TaskSource) -> HarnessTasks:
    """72 training and 36 held-out everyday-assistant tasks (split by construction, as the toolbox's)."""
    from harnessrl.harness_examples.assistant import harness as assistant
    from harnessrl.harness_examples.assistant import tasks as assistant_tasks

    if src.tasks:
        train, held = split_tasks(assistant_tasks.read(src.tasks)[: src.n_tasks], src.eval_fraction)
    else:
        train, held = first_tasks(*assistant_tasks.generate(src.seed), src)

    def run(url, task, group_id, run_tag, temperature):
        return assistant.run_rollout(url, task, assistant.AssistantConfig(temperature=temperature),
                                     group_id=group_id, run=run_tag)

    return HarnessTasks(train, held, run, lambda t: t.id, assistant_tasks.write(train + held, src.out / "tasks.jsonl"))


def _family(name: str) -> Callable[[TaskSource], HarnessTasks]:
    """The learning benchmark's task families (docs/benchmarks.md › Learning, Task families): 64
    training and 64 held-out tasks of the seed's world, a fresh world per training round, as
    `toolbox`'s (`--tasks` reads a written file, split by `--eval-fraction`)."""
    def load(src: TaskSource) -> HarnessTasks:
        from harnessrl.harness_examples.toolbox import multihop, noisy_delegate, slow, sparse
        from harnessrl.harness_examples.toolbox import harness as toolbox
        from harnessrl.harness_examples.toolbox import tasks as toolbox_tasks

        module, generate, run_one, worlds = {
            "multihop": (multihop, multihop.generate, lambda url, table, task, t, **kw: multihop.run_rollout(
                url, table, task, multihop.MultihopConfig(temperature=t), **kw), multihop),
            "noisy_delegate": (noisy_delegate, lambda seed: noisy_delegate.generate(seed, True),
                               lambda url, table, task, t, **kw: noisy_delegate.run_rollout(
                                   url, table, task, noisy_delegate.NoisyConfig(temperature=t), **kw), multihop),
            "noisy_single": (noisy_delegate, lambda seed: noisy_delegate.generate(seed, False),
                             lambda url, table, task, t, **kw: noisy_delegate.run_rollout(
                                 url, table, task, noisy_delegate.NoisyConfig(temperature=t), **kw), multihop),
            "toolbox_sparse": (toolbox_tasks, sparse.generate, lambda url, table, task, t, **kw: toolbox.run_rollout(
                url, table, task, toolbox.ToolboxConfig(temperature=t), **kw), toolbox_tasks),
            "toolbox_slow": (slow, slow.generate, slow.run_rollout, toolbox_tasks)}[name]
        if src.tasks:
            train, held = split_tasks(module.read(src.tasks)[: src.n_tasks], src.eval_fraction)
        else:
            train, held = first_tasks(*generate(src.seed), src)
        held_out, eval_ids = worlds.world(src.seed), {t.id for t in held}

        def run(url, task, group_id, run_tag, temperature):
            table = held_out if task.id in eval_ids or run_tag.startswith("eval") else \
                worlds.training_world(src.seed, run_tag)
            return run_one(url, table, task, temperature, group_id=group_id, run=run_tag)

        return HarnessTasks(train, held, run, lambda t: t.id, module.write(train + held, src.out / "tasks.jsonl"))

    return load


def _search(name: str) -> Callable[[TaskSource], HarnessTasks]:
    """A harness over the fictional-world (or a real) search corpus."""
    def load(src: TaskSource) -> HarnessTasks:
        from harnessrl.harness_examples.langgraph_search import harness as langgraph
        from harnessrl.harness_examples.planner_worker import harness as planner_worker
        from harnessrl.harness_examples.react import harness as react
        from harnessrl.harness_examples.search_task import export_tasks, load_search_tasks

        module, config_cls = {"react": (react, react.ReactConfig),
                              "planner_worker": (planner_worker, planner_worker.PlannerWorkerConfig),
                              "langgraph": (langgraph, langgraph.LangGraphConfig)}[name]
        taskset = load_search_tasks(src.corpus, src.tasks, seed=src.seed)
        all_tasks = taskset.tasks[: src.count]
        train, held = split_tasks(all_tasks, src.eval_fraction)
        file = src.out / "tasks.jsonl"
        export_tasks(all_tasks, file)

        def run(url, task, group_id, run_tag, temperature):
            return module.run_rollout(url, taskset.env, task, config_cls(temperature=temperature),
                                      group_id=group_id, run=run_tag)

        return HarnessTasks(train, held, run, lambda t: t.id, file)

    return load


def _bfcl(src: TaskSource) -> HarnessTasks:
    from harnessrl.harness_examples.bfcl_multiturn import data as bfcl_data
    from harnessrl.harness_examples.bfcl_multiturn import harness as bfcl

    ids = [line.strip() for line in src.tasks.read_text().splitlines() if line.strip()] if src.tasks else None
    all_tasks = bfcl_data.load_tasks(ids=ids, limit=None if ids else src.count)
    train, held = split_tasks(all_tasks, src.eval_fraction)

    def run(url, task, group_id, run_tag, temperature):
        return bfcl.run_rollout(url, task, bfcl.BfclConfig(temperature=temperature), group_id=group_id, run=run_tag)

    return HarnessTasks(train, held, run, lambda t: t.id, None)


def _bfcl_single(src: TaskSource) -> HarnessTasks:
    """`--n-tasks` BFCL single-turn tasks, `--eval-fraction` of them from the ids held out by hash
    (never trained on), the training ones drawn by `--seed`; `--tasks FILE` narrows the pool to the
    categories or ids it lists, one a line."""
    from harnessrl.harness_examples.bfcl_single import data as bfcl_data
    from harnessrl.harness_examples.bfcl_single import harness as bfcl_single

    pool = bfcl_data.read_selection(src.tasks) if src.tasks else bfcl_data.load_tasks()
    train, held = bfcl_data.choose(pool, src.count, src.eval_fraction, src.seed)

    def run(url, task, group_id, run_tag, temperature):
        return bfcl_single.run_rollout(url, task, bfcl_single.BfclSingleConfig(temperature=temperature),
                                       group_id=group_id, run=run_tag)

    return HarnessTasks(train, held, run, lambda t: t.id, bfcl_data.write(train + held, src.out / "tasks.jsonl"))


HARNESSES: dict[str, Harness] = {h.name: h for h in (
    Harness("lookup", "look a key up with a tool, answer its value (the demo's task family)", _lookup),
    Harness("toolbox", "pick one of four attribute tools and fill its argument (the learning benchmark)",
            _toolbox(False)),
    Harness("assistant", "everyday questions in plain English: one of nine tools over cities, products and "
            "people, and its argument (for a real instruct model)", _assistant),
    Harness("toolbox_delegate", "toolbox behind a planner that must ask a worker (MATPO-style)", _toolbox(True)),
    Harness("multihop", "two hops, relation tool then attribute tool on its result (the CAPO family)",
            _family("multihop")),
    Harness("noisy_delegate", "two hops delegated to workers whose tool outputs are long and noisy (the MATPO "
            "family)", _family("noisy_delegate")),
    Harness("noisy_single", "noisy_delegate's tasks for one agent with the tools (MATPO's single-agent baseline)",
            _family("noisy_single")),
    Harness("toolbox_sparse", "toolbox tasks for a warm start that almost never succeeds (the PACT family)",
            _family("toolbox_sparse")),
    Harness("toolbox_slow", "toolbox tasks whose environment takes a long-tailed per-task time in the first tool "
            "call, like CLI sessions (the async benchmark)", _family("toolbox_slow")),
    Harness("react", "ReAct loop with search and calculator tools", _search("react")),
    Harness("planner_worker", "planner dispatching search workers (MATPO-style)",
            _search("planner_worker")),
    Harness("langgraph", "LangGraph agent through langchain-openai", _search("langgraph")),
    Harness("bfcl", "BFCL multi-turn function calling with executable back-ends", _bfcl),
    Harness("bfcl_single", "BFCL single-turn AST categories, scored by BFCL's own AST checker", _bfcl_single),
)}


def harness_help() -> str:
    return " | ".join(HARNESSES) + " | module:function (your own: see docs/harness-examples.md, Your own harness)"


def user_harness(spec: str, src: TaskSource) -> HarnessTasks:
    """`module:function`, called as `function(proxy_url, task, *, group_id, run, temperature)` like the
    examples' `run_rollout`: it opens its rollout with `HarnessRL(proxy_url).rollout(task_id=task.id,
    group_id=group_id, run=run)`, reports the outcome, and returns a `RolloutResult` or the outcome.
    Tasks come from `--tasks`, a `harnessrl tasks import` JSONL file (passed as `TaskRow`s)."""
    from harnessrl.tasks_file import TaskRow, read_tasks
    from harnessrl.harness_examples.chat import RolloutResult

    fn = load_function(spec, "--harness")
    if src.tasks is None:
        raise UserError(f"--harness {spec}: give the tasks with --tasks FILE (JSONL: id, input, reference, ...)")
    rows = read_tasks(src.tasks)[: src.count]
    train, held = split_tasks(rows, src.eval_fraction)

    def run(url: str, task: TaskRow, group_id: str, run_tag: str, temperature: float) -> RolloutResult:
        result = fn(url, task, group_id=group_id, run=run_tag, temperature=temperature)
        if isinstance(result, RolloutResult):
            return result
        if isinstance(result, (int, float)) and not isinstance(result, bool):
            return RolloutResult(rollout_id="", task_id=task.id, outcome=float(result))
        raise UserError(f"--harness {spec}: returned {type(result).__name__}; return the outcome (a number) "
                        "or a RolloutResult")

    return HarnessTasks(train, held, run, lambda t: t.id, src.tasks)


def load_harness(name: str, src: TaskSource) -> HarnessTasks:
    """The named harness (or `module:function`) with its training and held-out tasks."""
    if ":" in name:
        return user_harness(name, src)
    if name not in HARNESSES:
        raise UserError(f"unknown harness {name!r}: use {harness_help()}")
    return HARNESSES[name].load(src)
