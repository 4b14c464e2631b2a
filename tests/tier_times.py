"""The test run's time per tier, printed at the end of every run: CI prints dots only, and a
session that keeps the suite under its budget has to know which tier the minutes go to.

A test counts in the first of TIERS it is marked with (its setup, call and teardown together; a
session fixture's build is charged to the first test that asks for it)."""

from __future__ import annotations

from collections import defaultdict

TIERS = ("vllm", "harness", "ray", "real_model", "sharded", "slow", "postgres", "unit")


def tier(keywords) -> str:
    return next((t for t in TIERS if t in keywords), "other")


class TierTimes:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.tests: dict[str, set[str]] = defaultdict(set)

    def pytest_runtest_logreport(self, report) -> None:
        name = tier(report.keywords)
        self.seconds[name] += report.duration
        self.tests[name].add(report.nodeid)

    def lines(self) -> list[str]:
        order = sorted(self.seconds, key=lambda t: -self.seconds[t])
        return [f"{t} {self.seconds[t]:.1f} s ({len(self.tests[t])} tests)" for t in order]

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.seconds:
            terminalreporter.write_line("time by tier (first of " + ", ".join(TIERS) + "; else other): "
                                        + "; ".join(self.lines()))
