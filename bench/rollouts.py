"""Rollouts per minute of `loop --cmd` with the built-in coding agent on the tiny model, by
concurrency, and what the sandbox costs a rollout.

    python bench/rollouts.py [--model DIR] [--rollouts 16] [--levels 1,4,16] [--max-turns 3]
                             [--sandbox-rollouts 8]

The loop's own parts, in this process as `harnessrl loop` runs them: the proxy (the embedded CPU
backend on the tiny model, recording to a temporary SQLite file), the local executor, and
`loop --cmd`'s runner on generated coding tasks — a fresh workspace per rollout, the built-in
agent (`python -m harnessrl.harness_examples.coding.agent`), the hidden tests as the reward.
Every level runs the same `--rollouts` tasks greedily (temperature 0: the same work at each
level). Printed: rollouts per minute at each concurrency and its ratio to concurrency 1, measured
in this run, with the mean seconds a rollout took and how many failed. The model, the agents and
their tests share the machine's cores, so the ratio says how far concurrency helps on this
machine (2 cores here); on a GPU with the model served elsewhere the agents' CPU is what is left.

Then the sandbox: the same `--sandbox-rollouts` tasks one at a time (nothing overlaps to hide a
cost) with `--sandbox bwrap` and with `--sandbox none`, in alternating order, and the difference
of the mean seconds per rollout: bubblewrap's namespaces and mounts, the relay to the proxy, for
the agent and for its hidden tests (the agent's work is the same greedy run either way).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.table import Table
from transformers.utils import logging as hf_logging

from harnessrl.app.rollouts.cmd_harness import cmd_harness
from harnessrl.app.rollouts.executors import LocalExecutor, run_batch
from harnessrl.app.rollouts.jobs import jobs_for, settle
from harnessrl.app.rollouts.harnesses import TaskSource
from harnessrl.app.rollouts.limited_run import RolloutFlags
from harnessrl.console import Console
from harnessrl.harness_examples.coding.tasks import write as write_tasks
from harnessrl.proxy.server import ProxyConfig, run_proxy


def batch(url: str, tmp: Path, tasks: Path, n: int, concurrency: int, sandbox: str, max_turns: int,
          tag: str) -> tuple[float, list]:
    """Seconds for `n` rollouts of the first `n` tasks, and their results."""
    agent = f"{sys.executable} -m harnessrl.harness_examples.coding.agent {{task}} --max-turns {max_turns}"
    src = TaskSource(tasks, None, tmp / tag, n + 1, 1 / (n + 1), 0)  # the last task is the held-out one
    h = cmd_harness(agent, src, None, False, RolloutFlags(sandbox=sandbox, timeout=600))
    jobs = jobs_for(h, h.train[:n], 1, tag, 0.0)
    started = time.perf_counter()
    results = run_batch(LocalExecutor(concurrency, deadline=900), h.run, url, jobs, tag)
    seconds = time.perf_counter() - started
    settle(url, tag, results)
    return seconds, results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model directory (default: build the tiny model)")
    ap.add_argument("--rollouts", type=int, default=16, help="rollouts at each concurrency")
    ap.add_argument("--levels", default="1,4,16", help="concurrencies, the first one the baseline")
    ap.add_argument("--max-turns", type=int, default=3, help="the agent's turn limit")
    ap.add_argument("--sandbox-rollouts", type=int, default=8, help="rollouts with and without the sandbox (0: skip)")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    hf_logging.disable_progress_bar()
    console = Console()
    with tempfile.TemporaryDirectory(prefix="bench-rollouts-") as tmp_name:
        tmp = Path(tmp_name)
        model = a.model
        if model is None:
            from harnessrl.tiny_model import build_tiny_model

            model = str(build_tiny_model(tmp / "tiny"))
        n = max(a.rollouts, a.sandbox_rollouts)
        tasks = write_tasks(tmp / "tasks", n + 1, 0)["all"]
        with run_proxy(ProxyConfig(db=str(tmp / "runs.db"), backend="local", model=model, port=0)) as proxy:
            batch(proxy.url, tmp, tasks, 1, 1, "none", a.max_turns, "warmup")  # imports, first model call
            table = Table(title=f"{a.rollouts} rollouts of the built-in coding agent (tiny model, sandboxed)")
            for col in ("concurrency", "seconds", "rollouts/min", "ratio to c=" + str(levels[0]),
                        "mean s/rollout", "failed"):
                table.add_column(col, justify="right")
            base = None
            for c in levels:
                seconds, results = batch(proxy.url, tmp, tasks, a.rollouts, c, "bwrap", a.max_turns, f"c{c}")
                rate = 60 * len(results) / seconds
                base = base or rate
                per = statistics.mean(r.metrics.get("harness_seconds", 0.0) + r.metrics.get("reward_seconds", 0.0)
                                      for r in results)
                table.add_row(str(c), f"{seconds:.1f}", f"{rate:.1f}", f"{rate / base:.2f}", f"{per:.2f}",
                              str(sum(1 for r in results if r.error)))
            console.print(table)
            if a.sandbox_rollouts:
                times: dict[str, list[float]] = {"bwrap": [], "none": []}
                for i, mode in enumerate(("bwrap", "none", "none", "bwrap")):  # alternating: drift hits both
                    seconds, _ = batch(proxy.url, tmp, tasks, a.sandbox_rollouts, 1, mode, a.max_turns, f"sb{i}-{mode}")
                    times[mode].append(seconds / a.sandbox_rollouts)
                on, off = statistics.mean(times["bwrap"]), statistics.mean(times["none"])
                console.print(f"sandbox: {on:.3f} s per rollout with bwrap, {off:.3f} s without: "
                              f"{on - off:+.3f} s ({(on - off) / off:+.1%}) per rollout, "
                              f"{2 * a.sandbox_rollouts} rollouts each way, one at a time")


if __name__ == "__main__":
    main()
