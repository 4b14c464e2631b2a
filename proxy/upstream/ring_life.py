"""The life of an `Upstreams` ring inside the proxy: its probe task, the SIGHUP re-read of
`--upstreams FILE`, and its gauges on `/metrics`."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from harnessrl.proxy.config import ProxyConfig
from harnessrl.proxy.upstream.http_pool import Pool
from harnessrl.proxy.upstream.ring import Upstreams, read_upstreams_file

log = logging.getLogger("harnessrl.proxy")


class _Collector:
    def __init__(self, ups: Upstreams) -> None:
        self.ups = ups

    def collect(self):
        up = GaugeMetricFamily("harnessrl_upstream_up", "1: taking calls; 0: taken out after failures or "
                               "draining for a weight push", labels=["url", "state"])
        inflight = GaugeMetricFamily("harnessrl_upstream_inflight", "Calls in flight", labels=["url"])
        served = CounterMetricFamily("harnessrl_upstream_calls", "Calls dispatched", labels=["url"])
        for u in self.ups.all:
            state = u.state()
            up.add_metric([u.url, state], 1.0 if state == "up" else 0.0)
            inflight.add_metric([u.url], u.inflight)
            served.add_metric([u.url], u.served)
        moves = CounterMetricFamily("harnessrl_upstream_session_moves", "Sessions sent to another upstream than "
                                    "their last one (an upstream failed, came back, or the list changed)",
                                    value=self.ups.moves)
        yield from (up, inflight, served, moves)


def start_upstreams(cfg: ProxyConfig, make_pool: Callable[[str], Pool], registry: CollectorRegistry) -> Upstreams:
    """The ring for `cfg.upstreams`, probing in the background; on SIGHUP `--upstreams FILE` is
    read again (where the loop runs on the main thread: `harnessrl proxy`)."""
    ups = Upstreams(list(cfg.upstreams), make_pool, cfg.fail_after, cfg.probe_s, push_wait_s=cfg.push_wait_s)
    loop = asyncio.get_running_loop()
    ups.probe_task = loop.create_task(ups.probe_forever())
    registry.register(_Collector(ups))
    if cfg.upstreams_file is not None:
        path = cfg.upstreams_file

        def reread() -> None:
            try:
                ups.set_urls(read_upstreams_file(path))
            except Exception as exc:  # noqa: BLE001 - a bad edit keeps the running list
                log.warning("SIGHUP: keeping the current upstreams: %s", exc)
                return
            log.warning("SIGHUP: upstreams now %s", ", ".join(u.url for u in ups.all))

        ups.reread = reread
        try:
            loop.add_signal_handler(signal.SIGHUP, reread)
        except (ValueError, RuntimeError, NotImplementedError):
            pass  # not the main thread (an embedded proxy): no signal handler there
    return ups


def stop_upstreams(ups: Upstreams) -> None:
    if ups.probe_task is not None:
        ups.probe_task.cancel()
    if ups.reread is not None:
        try:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        except (ValueError, RuntimeError, NotImplementedError):
            pass
    ups.close()
