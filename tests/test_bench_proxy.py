"""bench/proxy_overhead.py's arithmetic against numbers worked out by hand: the CPU bound (the
ratio CPU allows, the proxy CPU per call the 0.6 target needs) and the medians over rounds; and
the base commit's package tree that bench/proxy_ab.py runs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the script imports its neighbour procs.py
    spec = importlib.util.spec_from_file_location("bench_proxy_overhead", BENCH / "proxy_overhead.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
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


def test_medians_over_rounds_by_hand(monkeypatch):
    bench = _bench(monkeypatch)
    n = len(bench.fields(bench.Round)) - 1  # every figure but `errors`
    rounds = [bench.Round(*([float(v)] * n), errors=e) for v, e in ((3, ""), (1, "x"), (10, ""))]
    mid = bench._median(rounds)
    assert [getattr(mid, f.name) for f in bench.fields(bench.Round)][:n] == [3.0] * n  # 1, 3, 10 -> 3
    # the median ratio of the rounds, not the ratio of median rates: 0.5, 0.4, 0.7 -> 0.5
    assert bench._spread([0.5, 0.4, 0.7]) == "0.50 (0.40–0.70)"
    assert bench._spread([0.444]) == "0.44"
    assert bench._spread([0.3, 0.5]) == "0.40 (0.30–0.50)"  # an even count: the mean of the middle two


def test_ab_bench_imports_the_base_tree_it_assembles(monkeypatch, tmp_path):
    """bench/proxy_ab.py runs the base commit's proxy from a package tree of symlinks that follows
    pyproject.toml's package-dir map: a proxy started on it must import the base's modules, not
    this checkout's installed ones."""
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_proxy_ab", BENCH / "proxy_ab.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    tree = Path(__file__).resolve().parents[1]
    shim = module.package_tree(tree, tmp_path / "pkg")
    code = ("import harnessrl.proxy.record.recorder as r, harnessrl.migrations.versions as v, harnessrl.records as m; "
            "print(r.__file__); print(v.__path__[0]); print(m.__file__)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(shim)}, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(shim / "harnessrl" / "proxy" / "record" / "recorder.py"),
                   str(shim / "harnessrl" / "migrations" / "versions"),
                   str(shim / "harnessrl" / "records.py")]
    assert Path(out[0]).resolve() == tree / "proxy" / "record" / "recorder.py"
