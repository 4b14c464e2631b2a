"""bench/proxy_overhead.py's CPU bound: the ratio CPU allows and the proxy CPU per call the 0.6
target needs, against numbers worked out by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the script imports its neighbour procs.py
    spec = importlib.util.spec_from_file_location("bench_proxy_overhead", BENCH / "proxy_overhead.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_bound_by_hand(monkeypatch):
    bench = _bench(monkeypatch)
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    # direct: the stand-in's one core limits (1/120 µs < 2 cores / 175 µs); proxied: the proxy's
    # (1/311 < 2/547): 120/311 = 0.386. For 0.6: 0.6/120 calls/µs = 1 call per 200 µs, so P ≤ 200 on
    # its core and P ≤ 2·200 - 58 - 178 = 164 on the machine's two cores
    assert bench._cpu_bound(55, 120, 58, 178, 311, workers=1) == ("0.39", "164")
    # two proxy processes: the machine's cores limit instead (2/547 calls/µs): 240/547 = 0.44
    assert bench._cpu_bound(55, 120, 58, 178, 311, workers=2) == ("0.44", "164")
    # a stand-in too slow through the proxy for 0.6 whatever the proxy costs: no such P
    assert bench._cpu_bound(10, 100, 10, 200, 50, workers=1)[1] == "nan"
