"""A command that ran a proxy exits without nanobind's leak report (issue 32).

Loading a transformers model imports torch._dynamo, which imports triton (libtriton is a
nanobind module). The proxy freezes the garbage collector for its lifetime (proxy/lifespan.py);
left frozen at exit, triton's objects were never freed and every such command ended with ~40
lines of `nanobind: leaked … instances` on stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_run_with_an_embedded_proxy_exits_without_a_leak_report(tiny_model_dir, tmp_path):
    harnessrl = Path(sys.executable).with_name("harnessrl")
    done = subprocess.run([str(harnessrl), "run", "--model", str(tiny_model_dir), "--db", str(tmp_path / "runs.db"),
                           "--no-intercept", "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "harnessrl run: rollout" in done.stderr  # the proxy ran
    assert "leaked" not in done.stderr, done.stderr


def test_the_collector_is_thawed_when_the_last_proxy_of_the_process_stops():
    import gc

    from harnessrl.proxy.lifespan import GC_GEN0, FrozenGC

    frozen, before = FrozenGC(), gc.get_threshold()
    frozen.start()
    frozen.start()  # a second embedded proxy
    frozen.stop()
    assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] == GC_GEN0  # one still serves
    frozen.stop()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
