"""One rollout's command under limits: in its workspace, sandboxed or not, scored by hidden tests.

The rules a user training coding agents relies on (docs/coding.md, "Sandbox and rewards" and
"What the reward trusts"):
- the command runs with its working directory the rollout's workspace (a fresh copy of the
  task's, or `RunOptions.workspace`), under `Limits` (sandbox/run.py), to its end or its timeout;
- a host-scored task's command is scored however it ended (issue 54): exiting non-zero, killed,
  or past its timeout (under bubblewrap the launcher kills it there and hands its workspace back),
  the tests run on what it left and the score is the policy's. A rollout is `failed` only for
  what the agent cannot cause: the loop stopped it, or the scorer itself failed (`ScorerFault`).
  A command that reports its own outcome (`--reward-from`) that crashes or times out is failed;
- after its sandbox is gone, the command's work is scored (scoring/hidden_tests.py): the agent's
  solution surface in a clean copy of the task's workspace, the hidden tests in a fresh sandbox,
  the reward from a signed per-test report (or the task's own reward command), with the test
  output as the reward's metadata. Whatever the policy's code does to the test run scores at
  most 0 for those tests: never a failed rollout. Calls the proxy refused do not change that
  reward (they are counted in the rollout's `errors`, and compile leaves such rollouts out unless
  `--on-call-error keep`), but the result's `error` names them so the loop counts it as failed.
- a task is checked when it is loaded (`coding_tasks`): its solution surface, and its hidden
  tests collected and passing on its reference (their node ids are what the reward counts).
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from harnessrl.app.rollouts.command import RunOptions, RunResult, outcome_of, reward_file_of
from harnessrl.app.sandbox.relay import local_url
from harnessrl.app.sandbox.run import Finished, Limits, Mounts, check_limits, relay, run_limited
from harnessrl.app.scoring.clean_room import solution_surface
from harnessrl.app.scoring.hostile import safe_meta, safe_text
from harnessrl.app.scoring.hidden_tests import (known_for_all, reference_tree, score_in_place, score_rollout,
                                                canaries_for_all)
from harnessrl.app.scoring.workspace import REWARD_MODES, CodingTask, check_tree, fresh_workspace
from harnessrl.client import Rollout
from harnessrl.errors import UserError
from harnessrl.tasks_file import TaskRow, read_tasks

DEFAULT_TIMEOUT = 1800.0  # seconds a `loop --cmd` rollout may run


@dataclass(frozen=True)
class RolloutFlags:
    """The per-rollout options of `harnessrl run` and `loop --cmd`."""
    sandbox: str | None = None  # bwrap | none; None: bwrap for tasks with a workspace, else none
    timeout: float | None = DEFAULT_TIMEOUT
    memory: int | None = 8 << 30  # bytes per process
    cpu_time: int | None = 3600  # CPU seconds per process
    reward_cmd: str | None = None  # default: the task's, else pytest on its hidden tests
    reward_mode: str = "pass-fraction"
    procs: int | None = 1024  # processes and threads of a rollout
    file_size: int | None = 1 << 30  # bytes per file written
    disk: int | None = 2 << 30  # bytes of the sandbox's workspace + HOME + TMPDIR
    output: int | None = 4 << 20  # bytes of the command's output the host keeps


def coding_task(row: TaskRow, tasks_file: Path) -> CodingTask | None:
    """The row's workspace, hidden tests and solution surface (None for a task without a workspace
    or hidden tests), its folders checked now; its known tests are `coding_tasks`'s."""
    if row.workspace is None and row.hidden_tests is None:
        return None
    where = f"task {row.id}"
    check_tree(row.workspace, f"{where}: workspace")
    check_tree(row.hidden_tests, f"{where}: hidden_tests")
    if row.hidden_tests is not None and row.workspace is None:
        raise UserError(f"{where}: hidden_tests need a workspace (the pristine copy the tests are scored in)")
    folders = tuple(t for t in (row.workspace, row.hidden_tests) if isinstance(t, Path))
    surface = solution_surface(row.solution, row.workspace, where) if row.workspace is not None else ()
    return CodingTask(row.workspace, row.hidden_tests, row.reward_cmd, (tasks_file.resolve().parent, *folders),
                      surface)


def coding_tasks(rows: list[TaskRow], tasks_file: Path, flags: RolloutFlags) -> dict[str, CodingTask | None]:
    """`coding_task` of each row, with the known tests of those the default runner scores (collected
    a few at a time, cached): a task whose hidden tests do not collect or do not pass on its
    reference is a one-line error here, before any rollout."""
    tasks = {row.id: coding_task(row, tasks_file) for row in rows}
    todo = [row for row in rows if (t := tasks[row.id]) is not None and t.hidden_tests is not None
            and t.reward_cmd is None and flags.reward_cmd is None]
    jobs = [(tasks[row.id], reference_tree(row.reference, f"task {row.id}"), f"task {row.id}") for row in todo]
    for row, (known, prints) in zip(todo, known_for_all(jobs)):
        tasks[row.id] = replace(tasks[row.id], known_tests=known, fingerprint=prints)
    # pytest files: canaries beside them, drawn afresh for this process (data tests need none)
    files = [(row.id, ref) for row, (_, ref, _) in zip(todo, jobs) if tasks[row.id].fingerprint[0] != "calls"]
    for (rid, _), task in zip(files, canaries_for_all([(tasks[rid], ref) for rid, ref in files])):
        tasks[rid] = task
    return tasks


def limits_for(flags: RolloutFlags, tasks: list[CodingTask | None], reward_from: str | None) -> Limits:
    """The checked limits of these tasks' rollouts; one line for options that cannot go together."""
    if flags.reward_mode not in REWARD_MODES:
        raise UserError(f"--reward-mode {flags.reward_mode!r}: use {' | '.join(REWARD_MODES)}")
    if flags.reward_cmd is not None and not flags.reward_cmd.strip():
        raise UserError("--reward-cmd: a shell command line, e.g. 'python -m pytest -q hidden_tests'")
    scored = flags.reward_cmd is not None or any(t is not None and t.hidden_tests is not None for t in tasks)
    if scored and reward_from is not None:
        raise UserError("--reward-from: the tasks' hidden tests (or --reward-cmd) give the reward; drop --reward-from")
    sandbox = flags.sandbox or ("bwrap" if any(t is not None and t.workspace is not None for t in tasks) else "none")
    limits = Limits(sandbox, flags.timeout, flags.memory, flags.cpu_time, flags.procs, flags.file_size, flags.disk,
                    flags.output)
    check_limits(limits)
    return limits


def limit_run(opts: RunOptions, tasks: Path | None, flags: RolloutFlags) -> RunOptions:
    """`harnessrl run` with limits: with --tasks, its --task's workspace and tests; without, the
    command runs (and may write) in the current folder."""
    task = None
    if tasks is not None:
        if opts.task is None:
            raise UserError("--tasks: name the task to run with --task ID")
        row = next((r for r in read_tasks(tasks) if r.id == opts.task), None)
        if row is None:
            raise UserError(f"--task {opts.task!r}: no such task in {tasks}")
        task = coding_tasks([row], tasks, flags)[row.id]
    limits = limits_for(flags, [task], opts.reward_from)
    return replace(opts, limits=limits, coding=task, workspace=Path.cwd(), reward_cmd=flags.reward_cmd,
                   reward_mode=flags.reward_mode)


def _sandbox_env(env: dict[str, str], urls: list[str]) -> dict[str, str]:
    """Base URLs rewritten to 127.0.0.1 at the same port, where the sandbox's relays listen."""
    out = dict(env)
    for url in urls:
        origin, local = url.rstrip("/"), local_url(url.rstrip("/"))
        if origin != local:
            out = {k: v.replace(origin, local) for k, v in out.items()}
    return out


def _run(cmd, env: dict[str, str], opts: RunOptions, mounts: Mounts, host_relay,
         stdout: IO | None) -> tuple[Finished, str | None]:
    """The command's end and, for `--reward-from stdout-json`, its last non-empty stdout line."""
    limits = opts.limits
    assert limits is not None
    if opts.reward_from != "stdout-json":
        return run_limited(cmd, env, limits, mounts, host_relay, stdout), None
    if stdout is not None:  # the output goes to a file: its last line is read back from there
        done = run_limited(cmd, env, limits, mounts, host_relay, stdout)
        stdout.flush()
        lines = [ln for ln in Path(stdout.name).read_text(errors="replace").splitlines() if ln.strip()]
        return done, lines[-1] if lines else None
    last: list[str] = []

    def tee(line: bytes) -> None:  # passed on as it comes: the command's output is still the user's
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
        if line.strip():
            last[:] = [line.decode(errors="replace").strip()]

    return run_limited(cmd, env, limits, mounts, host_relay, None, on_line=tee), (last or [None])[0]


def run_limited_rollout(ro: Rollout, cmd, opts: RunOptions, env: dict[str, str], stdout: IO | None,
                        urls: list[str], codex_home: Path) -> RunResult:
    limits, task = opts.limits, opts.coding
    assert limits is not None
    fresh = task is not None and task.workspace is not None
    ws = fresh_workspace(task) if fresh else (opts.workspace or Path.cwd())
    try:
        env = {**env, "HARNESSRL_WORKSPACE": str(ws)}
        reward_file = reward_file_of(opts, env)
        writable = (codex_home,) + ((reward_file.parent,) if reward_file is not None else ())
        mounts = Mounts(ws, writable, (*(task.source_paths if task is not None else ()), *opts.hidden), opts.readable)
        with relay(limits, urls) as host_relay:
            if host_relay is not None:
                env = _sandbox_env(env, urls)
            done, last = _run(cmd, env, opts, mounts, host_relay, stdout)
        metrics = {"exit_code": float(done.code), "harness_seconds": round(done.seconds, 3),
                   "timed_out": float(done.timed_out)}
        if done.stopped:
            return RunResult(ro.id, done.code, None, error="stopped: the loop ended before this rollout did",
                             metrics=metrics)
        if done.capped:  # a cap hit is the policy's doing: scored like any other end
            metrics["capped"] = 1.0
        host_scored = task is not None and task.hidden_tests is not None or opts.reward_cmd is not None
        if not host_scored:
            if done.timed_out:
                return RunResult(ro.id, done.code, None, error=f"timed out after {limits.timeout:g} s",
                                 metrics=metrics)
            # scored by the command itself: `--reward-from exit-code` makes a crash its 0
            failed = f"exit code {done.code}" if done.code != 0 and not done.capped else None
            outcome, warning = outcome_of(opts.reward_from, done.code, last, reward_file)
            if outcome is not None:
                ro.reward(outcome)
            return RunResult(ro.id, done.code, outcome, [warning] if warning else [], failed, metrics)
        # the harness's sandbox (and with it every process it left) is gone: the tests run in a new one
        # on what it left, however it ended: a crash, a kill or a timeout is the policy's doing, scored
        # (a failed rollout would let a policy escape a bad score); only the scorer's own fault is `failed`
        reward_cmd = opts.reward_cmd or (task.reward_cmd if task is not None else None)
        try:
            if fresh:
                assert task is not None
                tests = score_rollout(task, ws, reward_cmd, opts.reward_mode, limits, mounts.hidden)
            else:  # no pristine workspace to start from: the user's own folder, scored by the user's command
                assert reward_cmd is not None
                tests = score_in_place(ws, reward_cmd, opts.reward_mode, limits, mounts.hidden)
        except Exception as exc:  # noqa: BLE001 - ScorerFault, or a fault of the scorer's own code
            return RunResult(ro.id, done.code, None, error=safe_text(f"the scorer failed: {exc}", 300),
                             metrics=metrics)
    finally:
        if fresh:
            shutil.rmtree(ws, ignore_errors=True)
    meta = safe_meta(tests.metadata)
    meta["harness"] = {"exit_code": done.code, "timed_out": done.timed_out, "capped": done.capped}
    metrics.update(reward_seconds=float(meta.get("seconds", 0.0)), tests_passed=float(meta.get("passed", 0)),
                   tests_total=float(meta.get("known") or meta.get("passed", 0) + meta.get("failed", 0)
                                     + meta.get("errors", 0)))
    ro.reward(tests.reward, "tests", metadata=meta)
    # not the test run's exit code: canaries (pytest mode) fail by design, and the data tests' child has its own
    all_pass = meta.get("failed", 0) + meta.get("errors", 0) == 0 and not meta["timed_out"] and "zero" not in meta
    metrics["success"] = 1.0 if all_pass and tests.reward > 0 else 0.0
    refused = int(ro.get().get("errors") or 0)
    error = f"{refused} call{'s' if refused != 1 else ''} refused by the proxy" if refused else None
    return RunResult(ro.id, done.code, tests.reward, metrics=metrics, error=error)
