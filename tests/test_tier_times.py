"""The per-tier time summary (tests/tier_times.py) on a real pytest run of three tests."""

import pytest

from tier_times import tier

pytestmark = pytest.mark.unit
pytest_plugins = ["pytester"]


def test_a_test_counts_in_its_first_tier():
    assert tier({"test_x": 1, "postgres": 1, "slow": 1}) == "slow"
    assert tier({"test_x": 1}) == "other"


def test_summary_line_sums_each_tier(pytester):
    pytester.makeconftest("from tier_times import TierTimes\n"
                          "def pytest_configure(config):\n"
                          "    config.pluginmanager.register(TierTimes(), 'tier_times')\n")
    pytester.makepyfile("""
        import time, pytest
        @pytest.mark.slow
        def test_slow():
            time.sleep(0.3)
        @pytest.mark.unit
        def test_unit():
            pass
        def test_plain():
            pass
    """)
    result = pytester.runpytest("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    line = next(x for x in result.outlines if x.startswith("time by tier"))
    tiers = {part.split()[0]: part.split()[1:] for part in line.split(": ", 1)[1].split("; ")}
    assert set(tiers) == {"slow", "unit", "other"}
    assert float(tiers["slow"][0]) >= 0.3 and tiers["slow"][2:] == ["(1", "tests)"]
    assert float(tiers["unit"][0]) < 0.3
    assert list(tiers)[0] == "slow"  # the longest tier first
