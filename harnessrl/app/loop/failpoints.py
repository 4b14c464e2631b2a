"""Named points of `loop --async` where a test kills the loop, `HARNESSRL_FAILPOINT=<name>`: SIGKILL,
as a crash or the OOM killer would, to check that it resumes at each one without losing a finished
group or training one twice (tests/test_loop_async_resume.py). Unset, a point costs one lookup."""

from __future__ import annotations

import os
import signal

POINTS = ("rollouts", "compile", "step", "push")  # a group's rollouts half in; compiled, not queued; trained, not saved; saved, not pushed


def hit(name: str) -> None:
    if os.environ.get("HARNESSRL_FAILPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
