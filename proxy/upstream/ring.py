"""Several inference servers behind one proxy: sticky sessions by consistent hashing, health,
and the drain gate a weight push closes (`upstream/weight_push.py`).

Each session (rollout, agent, session) hashes to a point on a ring of virtual nodes; the first
upstream clockwise that is up serves it, for the session's life. So a session keeps its
replica's prefix cache hot and one weight version, adding or removing a replica moves only the
sessions whose arc changes hands (about 1/N of them), and every proxy process on the same
upstream list routes a session the same way without sharing any state.

An upstream is taken out after `fail_after` consecutive failures (connection errors, timeouts,
5xx) and probed (`GET /v1/models`) with exponential backoff until it answers; its sessions go
to the next upstream on the ring meanwhile and come back after. Calls hold a `Lease` for their
whole life (streams included): it counts in-flight calls, which a drain waits for, and it
carries the pool the route forwards with (`Request.upstream`).

One `--upstream` needs none of this: the routes keep their single `Pool` and pay nothing.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from harnessrl.errors import UserError
from harnessrl.proxy.errors import ProxyError
from harnessrl.proxy.upstream.http_pool import Pool, Response, UpstreamConnectionError

log = logging.getLogger("harnessrl.proxy")
VNODES = 64  # virtual nodes per upstream: arcs even to a few percent with 3 replicas
_REMEMBERED = 1 << 16  # sessions whose last upstream is kept, to count moves


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def read_upstreams_file(path: str) -> list[str]:
    """One URL a line; blank lines and `#` comments skipped."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UserError(f"--upstreams: cannot read {path}: {exc.strerror}") from None
    urls = [line.split("#", 1)[0].strip() for line in lines]
    return [u for u in urls if u]


def _key_point(key: tuple) -> int:
    return _point("\x1f".join(map(str, key)))


@functools.lru_cache(maxsize=8)
def _ring(urls: tuple[str, ...]) -> tuple[list[int], list[str]]:
    points = sorted((_point(f"{u}#{i}"), u) for u in urls for i in range(VNODES))
    return [p for p, _ in points], [u for _, u in points]


def ring_order(urls: list[str], key: tuple) -> list[str]:
    """The upstreams in the order session `key` tries them, its arc's owner first. Depends on
    the URLs alone, so every proxy process on the same list agrees."""
    hashes, owners = _ring(tuple(urls))
    start = bisect.bisect(hashes, _key_point(key))
    seen: list[str] = []
    for j in range(len(owners)):
        u = owners[(start + j) % len(owners)]
        if u not in seen:
            seen.append(u)
            if len(seen) == len(urls):
                break
    return seen


class Upstream:
    """One replica: its pool, health and drain state."""

    def __init__(self, url: str, pool: Pool) -> None:
        self.url = url
        self.pool = pool
        self.up = True
        self.failures = 0  # consecutive
        self.inflight = 0
        self.served = 0
        self.version: str | None = None  # the weight version it last confirmed (after a push)
        self.adapter: str | None = None  # the LoRA adapter last pushed: calls name it as their model
        self.open = asyncio.Event()  # cleared while a push drains and reloads it
        self.open.set()
        self.idle = asyncio.Event()  # set while nothing is in flight
        self.idle.set()
        self.retry_at = 0.0
        self.backoff = 0.0

    def state(self) -> str:
        return "draining" if not self.open.is_set() else ("up" if self.up else "down")


class Lease:
    """A call's hold on its upstream: Pool's `request`/`stream`, with health accounting."""

    __slots__ = ("ups", "u", "done")

    def __init__(self, ups: Upstreams, u: Upstream) -> None:
        self.ups, self.u, self.done = ups, u, False

    @property
    def url(self) -> str:
        return self.u.url

    @property
    def version(self) -> str | None:
        """The weight version last pushed to this upstream: recorded on calls it answers without
        reporting one (vLLM's OpenAI routes report none)."""
        return self.u.version

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter last pushed to this upstream: vLLM serves it only to calls naming it."""
        return self.u.adapter

    async def request(self, method: str, path: str, body: bytes | None = None,
                      headers: dict[str, str] | None = None) -> Response:
        try:
            resp = await self.u.pool.request(method, path, body, headers)
        except (UpstreamConnectionError, asyncio.TimeoutError):
            self.ups.failed(self.u)
            raise
        self.ups.answered(self.u, resp.status)
        return resp

    async def stream(self, method: str, path: str, body: bytes | None = None,
                     headers: dict[str, str] | None = None):
        try:
            resp, chunks = await self.u.pool.stream(method, path, body, headers)
        except (UpstreamConnectionError, asyncio.TimeoutError):
            self.ups.failed(self.u)
            raise
        self.ups.answered(self.u, resp.status)
        return resp, chunks

    def release(self) -> None:
        if not self.done:
            self.done = True
            self.u.inflight -= 1
            if self.u.inflight == 0:
                self.u.idle.set()


class Upstreams:
    """The replicas and the ring. `make_pool(url)` builds a keep-alive pool; `push_wait_s`: how
    long a call for a draining upstream waits before a retryable 503."""

    def __init__(self, urls: list[str], make_pool: Callable[[str], Pool], fail_after: int = 3,
                 probe_s: float = 1.0, probe_max_s: float = 30.0, push_wait_s: float = 30.0) -> None:
        self._make_pool = make_pool
        self.fail_after = fail_after
        self.probe_s = probe_s
        self.probe_max_s = probe_max_s
        self.push_wait_s = push_wait_s
        self.by_url: dict[str, Upstream] = {}
        self.moves = 0  # sessions sent to another upstream than their last one
        self._last: OrderedDict[tuple, Upstream] = OrderedDict()
        self.set_urls(urls)
        self.push_lock = asyncio.Lock()  # one weight push at a time
        self.probe_task: asyncio.Task | None = None  # set by `upstream.ring_life.start_upstreams`
        self.reread: Callable[[], None] | None = None  # re-reads --upstreams FILE (SIGHUP)

    # ---- membership ------------------------------------------------------------------------
    def set_urls(self, urls: list[str]) -> None:
        """Adopt a new upstream list (start, SIGHUP): kept URLs keep their pool and health."""
        urls = list(dict.fromkeys(u.rstrip("/").removesuffix("/v1") for u in urls))
        if not urls:
            raise UserError("the upstream list is empty")
        old = self.by_url
        self.by_url = {u: old.get(u) or Upstream(u, self._make_pool(u)) for u in urls}
        for u, gone in old.items():
            if u not in self.by_url:
                gone.pool.close()  # idle connections; calls in flight keep theirs
        self._points, owners = _ring(tuple(self.by_url))
        self._owners = [self.by_url[u] for u in owners]

    @property
    def all(self) -> list[Upstream]:
        return list(self.by_url.values())

    # ---- choosing --------------------------------------------------------------------------
    def home(self, key: tuple) -> Upstream:
        """The upstream `key` goes to now: its arc's owner, or the next one up clockwise."""
        n = len(self._owners)
        i = bisect.bisect(self._points, _key_point(key))
        first = None
        for j in range(n):
            u = self._owners[(i + j) % n]
            if first is None:
                first = u
            if u.up:
                return u
        assert first is not None
        return first  # all down: the owner answers with its own error

    async def acquire(self, key: tuple) -> Lease:
        """The lease for a call of session `key`; waits while its upstream drains for a push
        (bounded by `push_wait_s`, then a 503 with Retry-After the harness's SDK retries)."""
        u = self.home(key)
        if not u.open.is_set():
            try:
                await asyncio.wait_for(u.open.wait(), self.push_wait_s)
            except asyncio.TimeoutError:
                raise ProxyError(503, f"upstream {u.url} is loading new weights; retry shortly", "server_error",
                                 code="upstream_reloading") from None
            u = self.home(key)  # it may have gone down meanwhile
        last = self._last.get(key)
        if last is not u:
            if last is not None:
                self.moves += 1
            self._last[key] = u
            if len(self._last) > _REMEMBERED:
                self._last.popitem(last=False)
        u.inflight += 1
        u.served += 1
        u.idle.clear()
        return Lease(self, u)

    # ---- health ----------------------------------------------------------------------------
    def failed(self, u: Upstream) -> None:
        u.failures += 1
        if u.up and u.failures >= self.fail_after:
            u.up = False
            u.backoff = self.probe_s
            u.retry_at = time.monotonic() + u.backoff
            log.warning("upstream %s taken out after %d consecutive failures", u.url, u.failures)

    def answered(self, u: Upstream, status: int) -> None:
        if status >= 500:
            self.failed(u)
        else:
            u.failures = 0

    async def probe_forever(self) -> None:
        """Probe each down upstream when its backoff runs out; one that answers comes back in."""
        while True:
            now = time.monotonic()
            for u in self.all:
                if not u.up and u.retry_at <= now:
                    await self._probe(u)
            await asyncio.sleep(min(self.probe_s, 1.0) / 4)

    async def _probe(self, u: Upstream) -> None:
        try:
            resp = await asyncio.wait_for(u.pool.request("GET", "/v1/models"), max(self.probe_s, 2.0))
            ok = resp.status < 500
        except Exception:  # noqa: BLE001 - refused, reset or too slow: still down
            ok = False
        if ok:
            u.up, u.failures, u.backoff = True, 0, 0.0
            log.warning("upstream %s answers again: back in", u.url)
        else:
            u.backoff = min(u.backoff * 2 or self.probe_s, self.probe_max_s)
            u.retry_at = time.monotonic() + u.backoff

    def snapshot(self) -> list[dict]:
        """Each upstream's state and load, for /ready and /metrics."""
        return [{"url": u.url, "state": u.state(), "inflight": u.inflight, "served": u.served,
                 "consecutive_failures": u.failures, "version": u.version} for u in self.all]

    def close(self) -> None:
        for u in self.all:
            u.pool.close()
