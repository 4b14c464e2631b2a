"""The README's table of real harnesses says what the compatibility suite runs: one row per
harness of harnesses.lock, at its pinned version, each with its test file."""

import re

import harness_cli as hc
import pytest


@pytest.mark.unit
def test_the_readme_table_lists_each_pinned_harness_at_its_version_with_its_tests():
    readme = (hc.ROOT / "README.md").read_text()
    table = readme.split("<!-- harness table -->", 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.strip().splitlines()[2:]]
    listed = {re.search(r"`([^`]+)`", row[0]).group(1): row[1] for row in rows}
    assert listed == {pin.name: pin.version for pin in hc.read_lock().values()}
    for name in listed:
        assert (hc.TESTS / f"test_harness_cli_{name.replace('-', '_')}.py").is_file(), name
        assert name in hc.HARNESSES
