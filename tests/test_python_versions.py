"""The Python versions claimed are the ones CI tests (issue 32): 3.11 (the whole suite) and 3.12
(the unit tests, `make test-py312`). 3.13 was claimed and never run: a 3.13 venv needs torch from
PyPI, a multi-GB CUDA download, so it is not claimed until a CI tier runs it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

pytestmark = pytest.mark.unit  # no server, database or training: also run on Python 3.12 in CI

REPO = Path(__file__).resolve().parents[1]
TESTED = ["3.11", "3.12"]


def test_requires_python_allows_exactly_the_tested_versions():
    spec = SpecifierSet(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"])
    allowed = [f"3.{minor}" for minor in range(8, 16) if f"3.{minor}.0" in spec]
    assert allowed == TESTED


@pytest.mark.parametrize("page", ["README.md", "docs/index.md", "scripts/install.sh"])
def test_the_set_up_pages_claim_the_tested_versions(page):
    claimed = sorted(set(re.findall(r"\b3\.1[0-9]\b", (REPO / page).read_text())))
    assert claimed == TESTED, f"{page} names Python {claimed}; CI tests {TESTED}"
