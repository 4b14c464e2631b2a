"""The suite of real harnesses itself: the README's table says what it runs (one row per harness of
harnesses.lock, at its pinned version, each run by tests/test_harness_cli.py), and a harness missing fails."""

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
    assert set(listed) == {h.pin for h in hc.HARNESSES.values()}  # each runs in tests/test_harness_cli.py


@pytest.mark.unit
def test_a_missing_harness_fails_and_one_the_install_could_not_put_in_place_skips(tmp_path, monkeypatch):
    lock = tmp_path / "harnesses.lock"
    lock.write_text("claude-code npm @anthropic-ai/claude-code 2.1.197 nowhere/npm\n")
    monkeypatch.setattr(hc, "LOCK", lock)
    monkeypatch.setattr(hc, "UNAVAILABLE", tmp_path / "unavailable")
    with pytest.raises(pytest.fail.Exception, match="claude-code 2.1.197 is not installed .*install_harnesses.sh"):
        hc.require("claude-code")
    (tmp_path / "unavailable").write_text("claude-code: npm (Node.js) is not installed\n")
    with pytest.raises(pytest.skip.Exception, match="could not be installed here: npm \\(Node.js\\) is not installed"):
        hc.require("claude-code")
