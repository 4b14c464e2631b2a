"""What the per-rollout caps cost one sandboxed launch (docs/benchmarks.md, "Sandbox overhead").

    python bench/sandbox_caps.py [--runs 20]

Median wall time of `run_limited` on `/bin/true` under bubblewrap with the proxy relay (no
endpoint), in rotating order: the workspace bound in as a host folder with no process cap (the
launch as before the caps), the same with the process cap (a pids cgroup where one can be made),
and every cap on a coding task's fresh workspace (copied into the size-capped tmpfs and handed
back over the pipe, unpacked in a second sandbox).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from harnessrl.app.sandbox.caps import pids_base
from harnessrl.app.sandbox.run import ROOT, Limits, Mounts, relay, run_limited
from harnessrl.app.scoring.workspace import CodingTask, fresh_workspace
from harnessrl.harness_examples.coding.tasks import generate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    [row], _ = generate(1, 0, seed=0, salt="bench")
    task = CodingTask(row["workspace"], row["hidden_tests"], None)
    outside = Path(tempfile.mkdtemp(prefix="bench-ws-"))  # not under ROOT: bound in, not copied
    ways = {"bound, no process cap": (Limits(sandbox="bwrap", procs=None, disk=None), outside),
            "bound, process cap": (Limits(sandbox="bwrap"), outside),
            "all caps, workspace copied in and back": (Limits(sandbox="bwrap"), None)}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(args.runs):
        for name in list(ways)[i % 3:] + list(ways)[:i % 3]:
            limits, ws = ways[name]
            fresh = ws is None
            ws = fresh_workspace(task) if fresh else ws
            with relay(limits, []) as host:
                start = time.perf_counter()
                done = run_limited(["/bin/true"], dict(os.environ), limits, Mounts(ws), host, None)
                times[name].append(time.perf_counter() - start)
            assert done.code == 0, (name, done)
            if fresh:
                assert (ws / "README.md").is_file()  # the workspace came back
                shutil.rmtree(ws)
    shutil.rmtree(outside)
    print(f"process cap by: {'pids cgroup' if pids_base() else 'RLIMIT_NPROC'}; {args.runs} runs; ROOT {ROOT}")
    for name, values in times.items():
        print(f"{name:42s} median {statistics.median(values) * 1000:6.1f} ms")


if __name__ == "__main__":
    main()
