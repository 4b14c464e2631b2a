"""What scoring a coding rollout costs, before and after the clean room (issue 42), and with the
verdict moved out of the agent's process (issue 54).

    python bench/scoring_overhead.py [--tasks 4] [--repeats 5] [--sandbox bwrap]

On generated coding tasks, each with the agent's work already in its workspace (the reference
fix on half of them, nothing on the others), one rollout's scoring step timed both ways, in
alternating order, in this run:
- before: the hidden tests laid over the agent's own workspace and `python -m pytest -q -p
  no:cacheprovider hidden_tests` run in a sandbox over it, the reward read from pytest's summary
  line (what `workspace.run_hidden_tests` did); and the same with pytest's plugin autoload off
  (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1, as the new runner has it), which isolates what the clean
  room and the signed report cost from what the installed plugins' import cost;
- after: `scoring.score_rollout` — a fresh copy of the pristine workspace, the agent's solution
  surface copied in without following links, the hidden tests, the runner (`python -I`, the
  signed report) in a fresh sandbox, the report checked against the task's known tests.
- round 2 (issue 54), the same tasks and cases: `score_rollout` with the pytest runner plus a
  canary file (pytest mode's hardening), and with the hidden cases as data (calls.py: the child
  evaluates the calls in a fresh sandbox, the host compares; the generated family's default).
Printed: the median seconds of each, their difference, and the clean room alone (its copy and
removal, no test run). Also the one-time cost of a task's known tests at load (the hidden tests
run on the reference, uncached), for both forms.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from harnessrl.app.rollouts.limited_run import RolloutFlags, coding_tasks
from harnessrl.app.sandbox.relay import HostRelay
from harnessrl.app.sandbox.run import ROOT, Limits, Mounts, run_limited
from harnessrl.app.scoring import hidden_tests as scoring
from harnessrl.app.scoring.workspace import fresh_workspace, lay, score
from harnessrl.harness_examples.coding.tasks import write
from harnessrl.tasks_file import read_tasks

OLD_CMD = f"{shlex.quote(sys.executable)} -m pytest -q -p no:cacheprovider hidden_tests"


def before(task, ws: Path, limits: Limits, autoload: bool = True) -> float:
    started = time.perf_counter()
    shutil.rmtree(ws / "hidden_tests", ignore_errors=True)
    lay(task.hidden_tests, ws)
    host_relay = HostRelay([], ROOT) if limits.sandbox == "bwrap" else None
    try:
        with tempfile.TemporaryFile() as out:
            env = dict(os.environ) if autoload else {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
            done = run_limited(OLD_CMD, env, limits, Mounts(ws), host_relay, out)
            out.seek(0)
            score(out.read().decode(errors="replace"), done, "pass-fraction")
    finally:
        if host_relay is not None:
            host_relay.close()
    return time.perf_counter() - started


def after(task, ws: Path, limits: Limits) -> float:
    started = time.perf_counter()
    scoring.score_rollout(task, ws, None, "pass-fraction", limits, ())
    return time.perf_counter() - started


def room(task, ws: Path) -> float:
    started = time.perf_counter()
    clean, _ = scoring.clean_room(task, ws)
    shutil.rmtree(clean)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sandbox", default="bwrap", choices=["bwrap", "none"])
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-scoring-"))
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")  # the known tests collected here, not read from a cache
    files = write(tmp / "tasks", args.tasks, 0, seed=0, salt="bench", hidden="pytest")
    rows = read_tasks(files["all"])
    started = time.perf_counter()
    tasks = coding_tasks(rows, files["all"], RolloutFlags())
    load = (time.perf_counter() - started) / len(rows)
    data_files = write(tmp / "data", args.tasks, 0, seed=0, salt="bench")  # the same cases, as data
    started = time.perf_counter()
    data_tasks = coding_tasks(read_tasks(data_files["all"]), data_files["all"], RolloutFlags())
    data_load = (time.perf_counter() - started) / len(rows)
    limits = Limits(sandbox=args.sandbox, timeout=120)
    bare = {rid: replace(t, canaries=(), canary_ids=()) for rid, t in tasks.items()}  # round 1: no canaries
    ways = {"before": lambda rid, w: before(tasks[rid], w, limits),
            "plain": lambda rid, w: before(tasks[rid], w, limits, autoload=False),
            "after": lambda rid, w: after(bare[rid], w, limits), "canaries": lambda rid, w: after(tasks[rid], w, limits),
            "data": lambda rid, w: after(data_tasks[rid], w, limits)}
    times: dict[str, list[float]] = {name: [] for name in ways}
    rooms = []
    for r in range(args.repeats):
        for i, row in enumerate(rows):
            task = tasks[row.id]
            order = list(ways)[(r + i) % len(ways):] + list(ways)[:(r + i) % len(ways)]  # each way first as often
            for name in order:
                ws = fresh_workspace(task)
                if i % 2:
                    lay(row.reference, ws)
                times[name].append(ways[name](row.id, ws))
                if name == "after":
                    rooms.append(room(task, ws))
                shutil.rmtree(ws, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    med = statistics.median
    print(f"{len(rows)} tasks x {args.repeats} repeats, --sandbox {args.sandbox}, {os.cpu_count()} cores")
    old, plain, new = med(times["before"]), med(times["plain"]), med(times["after"])
    print(f"scoring before (tests over the agent's workspace): median {old:.3f} s")
    print(f"  the same, pytest's plugin autoload off: median {plain:.3f} s")
    print(f"scoring after (clean room, runner, signed report): median {new:.3f} s")
    print(f"after - before: {new - old:+.3f} s per rollout; after - before without autoload: {new - plain:+.3f} s; "
          f"the clean room alone: median {med(rooms) * 1000:.1f} ms")
    print(f"known tests at load (once per task, then cached): {load:.3f} s per task")
    canary, data = med(times["canaries"]), med(times["data"])
    print(f"round 2: the runner with a canary file: median {canary:.3f} s ({canary - new:+.3f} s); the hidden "
          f"cases as data: median {data:.3f} s ({data - new:+.3f} s); the data cases checked at load: "
          f"{data_load:.3f} s per task")


if __name__ == "__main__":
    main()
