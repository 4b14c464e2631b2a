"""bench/proxy_stages.py's clock against a hand-driven one: a stage's time is exclusive (a stage
called from another counts in its own row), a coroutine counts only while it runs (the loop's
work while it awaits belongs to no stage), and an async generator's steps count like a
coroutine's."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _stages(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_proxy_stages", BENCH / "proxy_stages.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_exclusive_time_per_stage_across_awaits(monkeypatch):
    ps = _stages(monkeypatch)
    now = [0]
    monkeypatch.setattr(ps.time, "thread_time_ns", lambda: now[0])
    clock = ps.Clock()
    clock.tid = threading.get_ident()

    def work(ns: int) -> None:
        now[0] += ns

    check = ps._timed(lambda: work(5), "check", clock)  # a sync stage inside a coroutine's

    async def serve(fut) -> str:
        work(10)
        check()
        await fut  # waiting: not the coroutine's time
        work(20)
        return "done"

    async def chunks():
        work(3)
        yield 1
        work(4)
        yield 2

    timed_serve = ps._timed(serve, "serve", clock)
    timed_chunks = ps._timed(chunks, "stream", clock)

    async def main() -> tuple[str, list[int]]:
        fut = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(timed_serve(fut))
        await asyncio.sleep(0)
        work(100)  # the loop's own work while `serve` awaits
        fut.set_result(None)
        got = [x async for x in timed_chunks()]
        return await task, got

    clock.reset()
    clock.enter(ps.REST)  # a first transition: counting starts here
    assert asyncio.run(main()) == ("done", [1, 2])
    clock.leave()
    assert clock.acc["serve"] == 30
    assert clock.acc["check"] == 5
    assert clock.acc["stream"] == 7
    assert clock.acc[ps.REST] == 100
