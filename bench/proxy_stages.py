"""One recorded call's CPU, stage by stage: where the proxy's time per call goes.

    python bench/proxy_stages.py [--upstream URL] [--clients 1] [--duration 4] [--stream] [--json]
                                 [--base REV [--rounds 3]]

Runs the proxy in this process (the same uvicorn stack and settings as `harnessrl proxy`,
recording into a fresh SQLite file) in front of the vLLM stand-in (started here unless
`--upstream` names one), and sends it the benchmark's load (`proxy_overhead.run_load`: its body,
`--clients` at once) from a process of its own. The CPU time of the proxy's event-loop thread
(the thread's own clock: neither the waits for the upstream nor other processes count) is split
among the stages below by timing the functions that make them up, on that thread only. A
coroutine or async generator is timed only while it runs, not while it awaits, so the split holds
under concurrency too; a stage's figure is exclusive (a stage called from another counts in its
own row only), and what no stage claims is the server loop's.

The load is first sent without the timing wrappers: the loop thread's CPU per call then is the
proxy's own figure. The wrappers cost about a microsecond per clock read; that cost is measured
(the timed run's total less the untimed one's) and taken out of each stage in proportion to the
clock reads charged to it, so the stages add up to the untimed figure. The recorder's writer
thread (WAL checkpoints; batches the loop could not commit without waiting) is measured by its
own thread clock.

`--base REV` profiles commit REV (checked out with `git worktree`, run as `bench/proxy_ab.py`
runs it) and this checkout in alternating runs and prints their medians side by side: before and
after. A function named in `STAGES` that a tree lacks is left out there; its time then falls to
the stage that calls it.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import free_port, standin_cmd, stop, wait_http  # noqa: E402
from rich.table import Table  # noqa: E402

# what no stage claims: the event loop, task switches, and the hot path's own code between the
# stages (routing, headers, `serve`, `handle`, the answer's JSON encoding); not timed by a wrapper
# of its own, since the outermost coroutines resume at every await of every call (their wrappers
# would cost more than what they measure)
REST = "event loop, task switches, hot-path glue (routing, headers, serve, handle, answer JSON)"
# (stage, the functions it is made of: "module:qualified name"), in the order a call meets them
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("HTTP in and out (uvicorn protocol, response send)", (
        "uvicorn.protocols.http.httptools_impl:HttpToolsProtocol.data_received",
        "uvicorn.protocols.http.httptools_impl:RequestResponseCycle.send",
        "starlette.responses:Response.__call__",
    )),
    ("parse and validate", (
        "harnessrl.proxy.model_endpoints:parse_json",
        "harnessrl.proxy.model_endpoints:read_body",
        "harnessrl.proxy.model_endpoints:ModelEndpoints._request",
    )),
    ("identity and agent naming", (
        "harnessrl.proxy.model_endpoints:check_auth",
        "harnessrl.proxy.model_endpoints:identify",
        "harnessrl.proxy.model_endpoints:check_scope",
        "harnessrl.proxy.rollouts.status:RolloutStatus.check",
        "harnessrl.proxy.serving:unnamed_agent",
        "harnessrl.proxy.model_endpoints:new_call_id",
    )),
    ("prefix lookup and volatile spans", (
        "harnessrl.proxy.serving:Serving._extends",
        "harnessrl.proxy.serving:Serving.remember",
        "harnessrl.proxy.routes.passthrough:PassThroughRoute.prompt",
    )),
    ("upstream request (body, pool, socket, answer read)", (
        "harnessrl.proxy.routes.passthrough:PassThroughRoute.run",
        "harnessrl.proxy.routes.passthrough:PassThroughRoute.stream",
        "harnessrl.proxy.upstream.http_pool:_Conn.data_received",
    )),
    ("upstream answer checked (ids, log-probs, stripped)", (
        "harnessrl.proxy.routes.passthrough:extract_and_strip",
        "harnessrl.proxy.routes.passthrough:_result",
        "harnessrl.proxy.upstream.vllm_wire:StreamAssembler.feed",
        "harnessrl.proxy.upstream.vllm_wire:StreamAssembler.finish",
    )),
    ("answer rendering", (
        "harnessrl.proxy.surfaces.openai_chat:ChatWire.__init__",
        "harnessrl.proxy.surfaces.openai_chat:ChatWire.response",
        "harnessrl.proxy.surfaces.openai_chat:_Wire.chunks",
        "harnessrl.proxy.surfaces.openai_chat:_Wire.close",
        "harnessrl.proxy.serving:Response.__init__",
    )),
    ("record building (row, packed ids, JSON)", (
        "harnessrl.proxy.serving:Serving.record",
        "harnessrl.proxy.serving:Serving.fill",
        "harnessrl.proxy.record.call_rows:_json",
    )),
    ("record commit (SQLite insert and commit, loop thread)", (
        "harnessrl.proxy.record.recorder:Recorder.commit",
        "harnessrl.proxy.record.inline_commit:InlineCommit._flush",
    )),
    ("metrics and log line", (
        "harnessrl.proxy.serving:Serving.done",
    )),
)


class Clock:
    """Exclusive CPU time of the loop thread by stage: `enter`/`leave` around each timed part."""

    def __init__(self) -> None:
        self.tid: int | None = None  # the event loop's thread: the only one timed
        self.acc: dict[str, int] = defaultdict(int)
        self.laps: dict[str, int] = defaultdict(int)  # clock reads charged to each stage
        self.stack = [REST]
        self.t: int | None = None  # the loop thread's clock at the last transition (None: none yet)

    def reset(self) -> None:
        """Start counting afresh (called from another thread: the loop thread's clock is read there)."""
        self.acc.clear()
        self.laps.clear()
        self.t = None

    def _lap(self, stage: str) -> None:
        now = time.thread_time_ns()
        if self.t is not None:
            self.acc[stage] += now - self.t
            self.laps[stage] += 1
        self.t = now

    def enter(self, stage: str) -> None:
        self._lap(self.stack[-1])
        self.stack.append(stage)

    def leave(self) -> None:
        self._lap(self.stack.pop())


class _Steps:
    """Awaits `coro`, timing each of its runs (from a resume to the next suspension) as `stage`."""

    __slots__ = ("coro", "stage", "clock")

    def __init__(self, coro, stage: str, clock: Clock) -> None:
        self.coro, self.stage, self.clock = coro, stage, clock

    def __await__(self):
        coro, clock, stage = self.coro, self.clock, self.stage
        value, exc = None, None
        while True:
            clock.enter(stage)
            try:
                out = coro.throw(exc) if exc is not None else coro.send(value)
            except StopIteration as stop_:
                return stop_.value
            finally:
                clock.leave()
            value, exc = None, None
            try:
                value = yield out
            except BaseException as e:  # noqa: BLE001 - handed to the coroutine
                exc = e


class _TimedGen:
    """An async generator whose every step (`__anext__`, `athrow`, `aclose`) is timed as `stage`."""

    def __init__(self, gen, stage: str, clock: Clock) -> None:
        self.gen, self.stage, self.clock = gen, stage, clock

    def __aiter__(self):
        return self

    # native coroutines, not bare `_Steps`: the builtin `anext(gen, default)` calls a non-coroutine
    # awaitable's `__await__` again at every resume (CPython 3.11), which resends a finished step
    async def __anext__(self):
        return await _Steps(self.gen.__anext__(), self.stage, self.clock)

    async def asend(self, value):
        return await _Steps(self.gen.asend(value), self.stage, self.clock)

    async def athrow(self, *exc):
        return await _Steps(self.gen.athrow(*exc), self.stage, self.clock)

    async def aclose(self):
        return await _Steps(self.gen.aclose(), self.stage, self.clock)


def _timed(fn, stage: str, clock: Clock):
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def coro(*a, **k):
            if threading.get_ident() != clock.tid:
                return await fn(*a, **k)
            return await _Steps(fn(*a, **k), stage, clock)
        return coro

    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        def agen(*a, **k):
            gen = fn(*a, **k)
            return gen if threading.get_ident() != clock.tid else _TimedGen(gen, stage, clock)
        return agen

    @functools.wraps(fn)
    def sync(*a, **k):
        if threading.get_ident() != clock.tid:
            return fn(*a, **k)
        clock.enter(stage)
        try:
            return fn(*a, **k)
        finally:
            clock.leave()
    return sync


def instrument(clock: Clock) -> tuple[list[str], list]:
    """Wrap every function of `STAGES` this checkout has; the names missing, and an undo list."""
    missing, undo = [], []
    for stage, names in STAGES:
        for name in names:
            mod_name, _, qual = name.partition(":")
            try:
                owner = importlib.import_module(mod_name)
                *path, attr = qual.split(".")
                for p in path:
                    owner = getattr(owner, p)
                raw = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
            except (ImportError, AttributeError, KeyError):
                missing.append(name)
                continue
            undo.append((owner, attr, raw))
            kind = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
            setattr(owner, attr, kind(_timed(raw.__func__, stage, clock)) if kind else _timed(raw, stage, clock))
    return missing, undo


def _thread_cpu_ns(thread: threading.Thread) -> int:
    return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))  # type: ignore[arg-type]


_LOAD = ("import sys; sys.path.insert(0, {bench!r}); from proxy_overhead import run_load; "
         "lat, err = run_load({url!r}, {clients}, {duration}, {stream}); print(len(lat), err)")


def _load(url: str, clients: int, duration: float, stream: bool) -> int:
    """`proxy_overhead.run_load` in a process of its own (it takes no CPU from the proxy's
    threads' clocks, nor their GIL); the calls answered. SystemExit if any failed."""
    code = _LOAD.format(bench=str(Path(__file__).resolve().parent), url=url, clients=clients, duration=duration,
                        stream=stream)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    done, errors = int(out[-2]), int(out[-1])
    if errors or not done:
        raise SystemExit(f"{errors} calls failed through the proxy ({done} answered)")
    return done


def profile(upstream: str, db: str, clients: int = 1, duration: float = 4.0, stream: bool = False) -> dict:
    """Run the proxy here and measure (module doc); the figures in µs per call."""
    import uvicorn

    from harnessrl.proxy.config import ProxyConfig
    from harnessrl.proxy.server import _bind, _uvicorn_config, build_app

    clock = Clock()
    cfg = ProxyConfig(upstreams=(upstream,), db=db, host="127.0.0.1", port=0, log_level="warning")
    app = build_app(cfg)
    sock = _bind("127.0.0.1", 0)
    server = uvicorn.Server(_uvicorn_config(app, cfg))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="proxy-loop", daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.01)
    clock.tid = th.ident
    writer = next(t for t in threading.enumerate() if t.name == "harnessrl-recorder")
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    def run(seconds: float) -> tuple[int, float, float]:
        loop0, writer0 = _thread_cpu_ns(th), _thread_cpu_ns(writer)
        n = _load(url, clients, seconds, stream)
        return n, (_thread_cpu_ns(th) - loop0) / n / 1e3, (_thread_cpu_ns(writer) - writer0) / n / 1e3

    try:
        run(1.0)  # warm: connections, caches, the prefix index's sessions
        calls, plain, plain_writer = run(duration)
        missing, undo = instrument(clock)
        run(0.5)
        clock.reset()
        timed_calls, timed, _ = run(duration)
        laps = dict(clock.laps)
        acc = dict(clock.acc)
        for owner, attr, raw in reversed(undo):
            setattr(owner, attr, raw)
    finally:
        server.should_exit = True
        th.join(timeout=30)
        sock.close()
    # what the wrappers cost, spread over the stages by the clock reads charged to each
    per_lap = max(0.0, (timed - plain) * timed_calls * 1e3 / max(sum(laps.values()), 1))
    stages = {s: (acc.get(s, 0) - per_lap * laps.get(s, 0)) / timed_calls / 1e3 for s in [*(s for s, _ in STAGES), REST]}
    return {"clients": clients, "stream": stream, "calls": calls, "loop_us": plain, "writer_us": plain_writer,
            "timed_loop_us": timed, "per_lap_ns": per_lap, "stages": stages, "missing": missing}


def table(res: dict, title: str = "one recorded call by stage") -> Table:
    """A rich table of `profile`'s result: each stage's µs per call and share of the loop thread."""
    mode = "streaming" if res["stream"] else "non-streaming"
    t = Table(title=f"{title}: {mode} chat, {res['clients']} client(s), {res['calls']:,} calls; CPU µs a call of the "
                    "proxy's event-loop thread")
    for col in ("stage", "µs/call", "share"):
        t.add_column(col, justify="right" if col != "stage" else "left")
    total = res["loop_us"]
    for stage, us in res["stages"].items():
        t.add_row(stage, f"{us:,.1f}", f"{us / total:.0%}" if total else "")
    t.add_row("[b]event-loop thread (untimed run: the proxy's own figure)[/b]", f"{total:,.1f}", "100%")
    t.add_row("recorder's writer thread (WAL checkpoints, hand-offs)", f"{res['writer_us']:,.1f}", "")
    t.add_row("(the timed run, wrappers included; their cost is taken out above)",
              f"{res['timed_loop_us']:,.1f}", "")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", default=None, help="a running vLLM stand-in (default: start one)")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--duration", type=float, default=4.0, help="seconds of load, untimed and timed each")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--base", default=None, help="also profile this earlier commit, in alternating runs")
    ap.add_argument("--rounds", type=int, default=3, help="with --base: runs of each side")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON (for proxy_overhead.py)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hrl-stages-"))
    standin = None
    from rich.console import Console

    console = Console(width=160)
    try:
        upstream = args.upstream
        if upstream is None:
            from harnessrl.tiny_model import build_tokenizer

            build_tokenizer().save_pretrained(tmp / "tok")
            port = free_port()
            standin = subprocess.Popen(standin_cmd(tmp / "tok", port))
            wait_http(port, standin, "stand-in")
            upstream = f"http://127.0.0.1:{port}"
        if args.base is not None:
            from proxy_stages_ab import compare

            console.print(compare(args.base, upstream, args.clients, args.duration, args.rounds, tmp, args.stream))
            console.print(f"load average: {os.getloadavg()[0]:.1f} (other processes share these cores)")
            return
        res = profile(upstream, str(tmp / "stages.db"), args.clients, args.duration, args.stream)
    finally:
        if standin is not None:
            stop(standin)
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(orjson.dumps(res).decode())
        return
    console.print(table(res))
    if res["missing"]:
        console.print(f"not in this checkout (their time counts in the caller's stage): {', '.join(res['missing'])}")


if __name__ == "__main__":
    main()
