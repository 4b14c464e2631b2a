"""`loop --cmd "…{task}…"`: any external program as the loop's harness.

The template is a shell line run once per task and sample, through `harnessrl run`'s machinery
(`run_in_rollout`): a rollout is created for it, the base-URL variables point at it, and with
`--intercept` one mitmdump (for the whole loop) catches hard-coded API hosts, each rollout's
identity riding in its proxy URL. Placeholders, shell-quoted: {task} (a JSON file with the task's
id and input), {input} (the task statement itself), {task_id}, {base_url}, {rollout}, {temperature}.
Each rollout runs under `RolloutFlags` (limited_run.py: timeout, memory, CPU, sandbox); a coding
task's rollout runs in a fresh copy of its workspace and is scored by its hidden tests. Otherwise
the outcome is `--reward-from` (exit-code | stdout-json | file: a file per rollout, its path in
$HARNESSRL_REWARD_FILE), else whatever outcome reward the program reported itself
(`$HARNESSRL_ROLLOUT`, `harnessrl reward`), and a compile-time `--reward` scores it against the
task's reference either way. Everything a rollout needs is made inside `run`, where it runs (a Ray node).
The program holds its rollout's own key only (`run_cmd`); with `--reward-from` or a coding task
the outcome is the scorer's, and that key cannot set it.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harnessrl.app.rollouts.command import REWARD_SOURCES, RunOptions
from harnessrl.app.rollouts.harnesses import HarnessTasks, TaskSource, split_tasks
from harnessrl.app.rollouts.intercept import InterceptConfig, Interceptor, start_intercept
from harnessrl.app.rollouts.limited_run import RolloutFlags, coding_tasks, limits_for
from harnessrl.app.rollouts.run_cmd import run_in_rollout
from harnessrl.app.sandbox.run import ROOT
from harnessrl.client import HarnessRL, Rollout
from harnessrl.errors import UserError
from harnessrl.harness_examples.chat import RolloutResult
from harnessrl.tasks_file import TaskRow, read_tasks

PLACEHOLDERS = ("{task}", "{input}", "{task_id}", "{base_url}", "{rollout}", "{temperature}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def fill(template: str, values: dict[str, str]) -> str:
    """Replace the known placeholders only: other braces (awk, JSON) are the command's own."""
    out = template
    for name, value in values.items():
        out = out.replace("{" + name + "}", shlex.quote(value))
    return out


def cmd_harness(template: str, src: TaskSource, reward_from: str | None, intercept: bool,
                flags: RolloutFlags | None = None, hidden: tuple[Path, ...] = ()) -> HarnessTasks:
    """`hidden`: more host paths its sandboxes must not read than the tasks' folders and `src.out`
    (the loop's output: runs.db, samples, the other rollouts' logs), e.g. a records DB elsewhere."""
    if not any(p in template for p in PLACEHOLDERS):
        raise UserError(f"--cmd: use at least one of {', '.join(PLACEHOLDERS)} (e.g. \"python agent.py {{task}}\")")
    if reward_from not in (None, "file", *REWARD_SOURCES):
        raise UserError("--reward-from with --cmd: exit-code | stdout-json | file (a file per rollout, its path in "
                        "$HARNESSRL_REWARD_FILE)")
    if src.tasks is None:
        raise UserError("--cmd: give the tasks with --tasks FILE (JSONL: id, input, reference, ...)")
    flags = flags or RolloutFlags()
    rows = read_tasks(src.tasks)[: src.count]
    coding = coding_tasks(rows, src.tasks, flags)
    limits = limits_for(flags, list(coding.values()), reward_from)
    train, held = split_tasks(rows, src.eval_fraction)
    logs = src.out / "cmd" / "logs"
    numbers = itertools.count()
    held_icpt: list[Interceptor] = []

    @contextmanager
    def around(proxy_url: str) -> Iterator[None]:
        if not intercept:
            yield
            return
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / "mitmdump.log", "a") as log, \
                start_intercept(InterceptConfig(proxy=proxy_url, port=0), log=log) as icpt:
            # no key of its own: a call counts only with its rollout's key (in the proxy URL's
            # username, `Interceptor.env`), so one rollout cannot pass for another through it
            held_icpt.append(icpt)
            try:
                yield
            finally:
                held_icpt.clear()

    def run(url: str, task: TaskRow, group_id: str, run_tag: str, temperature: float) -> RolloutResult:
        safe = _UNSAFE.sub("_", task.id)
        ROOT.mkdir(parents=True, exist_ok=True)
        # the {task} file, readable in a sandbox (the folder is bound in, read-only)
        task_dir = Path(tempfile.mkdtemp(prefix="task-", dir=ROOT))
        (task_dir / f"{safe}.json").write_text(json.dumps({"id": task.id, "input": task.input}))
        text = task.input if isinstance(task.input, str) else json.dumps(task.input)

        def command(ro: Rollout) -> str:
            return fill(template, {"task": str(task_dir / f"{safe}.json"), "input": text, "task_id": task.id,
                                   "base_url": ro.base_url("main"), "rollout": ro.id, "temperature": f"{temperature:g}"})

        log_path = logs / run_tag / f"{safe}.{next(numbers)}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        per_rollout = reward_from
        if reward_from == "file":
            # a folder of its own, bound writable into its sandbox: beside the logs, a rollout could
            # read the others' logs and write a group-mate's reward file
            per_rollout = str(Path(tempfile.mkdtemp(prefix="reward-", dir=ROOT)) / "reward")
        opts = RunOptions(task=task.id, group=group_id, run=run_tag, reward_from=per_rollout, limits=limits,
                          coding=coding.get(task.id), reward_cmd=flags.reward_cmd, reward_mode=flags.reward_mode,
                          readable=(task_dir,), hidden=(src.out.resolve(), *hidden))
        try:
            with HarnessRL(url) as client, open(log_path, "w") as log:  # the operator's key (`default_key`)
                result = run_in_rollout(client, command, opts, held_icpt[0] if held_icpt else None, stdout=log,
                                        extra_env={"HARNESSRL_TEMPERATURE": f"{temperature:g}"})
                outcome = result.outcome
                if outcome is None and result.error is None:  # the program may have reported it itself
                    rewards = client.get_rollout(result.rollout_id)["rewards"]
                    outcome = next((r["value"] for r in reversed(rewards) if r["kind"] == "outcome"), None)
        finally:
            shutil.rmtree(task_dir, ignore_errors=True)
            if reward_from == "file":
                shutil.rmtree(Path(per_rollout).parent, ignore_errors=True)
        metrics = {"exit_code": float(result.exit_code), **result.metrics}
        error = None if result.error is None else f"{result.error}, see {log_path}"
        # a failed rollout's outcome is a placeholder: `error` says it is not a score (and compile leaves it out)
        return RolloutResult(rollout_id=result.rollout_id, task_id=task.id, outcome=outcome or 0.0, metrics=metrics,
                             error=error)

    return HarnessTasks(train, held, run, lambda t: t.id, src.tasks, around=around)
