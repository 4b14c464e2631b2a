"""The hidden tests' runner in the clean room (scoring.py), run by path in a fresh sandbox:

    python -I scoring_runner.py IO_DIR WORKSPACE -- PYTEST_ARGS...

Standard library and pytest only, never imported by harnessrl. `-I`: no PYTHONPATH, no user
site, neither the working directory nor this file's folder on sys.path, so nothing in the
workspace can stand in for pytest or its plugins. Before pytest starts — so before any of the
workspace's code runs — it reads the scorer's one-time file IO_DIR/nonce (a random key and the
report's random name), unlinks it and opens the report file, keeping the descriptor. Only then is
the workspace put on sys.path (first, as `python -m pytest` would have it: its top level is the
task's own, scoring.py laid it) and pytest run with `Reporter` as a plugin object: the collected
node ids and each test's outcome per phase, from pytest's own reports. At the end the report is
written, signed with HMAC-SHA256 under the key, and the process leaves at once with pytest's exit
status (`os._exit`: no atexit hook of the code under test runs after it).

What this does not stop, and how the scorer bounds it, is in docs/coding.md ("What the reward
trusts"): the code under test runs in this process.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys


class Reporter:
    """pytest's own per-test reports, as they happen."""

    def __init__(self) -> None:
        self.collected: list[str] = []
        self.outcomes: dict[str, dict[str, str]] = {}  # node id -> {phase: passed | failed | skipped | xfail}

    def pytest_collection_finish(self, session) -> None:
        self.collected = [item.nodeid for item in session.items]

    def pytest_runtest_logreport(self, report) -> None:
        outcome = "xfail" if hasattr(report, "wasxfail") else report.outcome
        self.outcomes.setdefault(report.nodeid, {})[report.when] = outcome


def main(argv: list[str]) -> None:
    io_dir, workspace, args = argv[0], argv[1], argv[3:] if argv[2:3] == ["--"] else argv[2:]
    nonce_path = os.path.join(io_dir, "nonce")
    fd = os.open(nonce_path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as f:
        secret = json.load(f)
    os.unlink(nonce_path)
    key = bytes.fromhex(secret["key"])
    out = os.open(os.path.join(io_dir, secret["report"]), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    del secret

    import pytest

    sys.path.insert(0, workspace)
    reporter = Reporter()
    code = int(pytest.main(args, plugins=[reporter]))
    payload = json.dumps({"exitstatus": code, "collected": reporter.collected, "outcomes": reporter.outcomes})
    mac = hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()
    data = memoryview(json.dumps({"payload": payload, "mac": mac}).encode())
    while data:
        data = data[os.write(out, data):]
    os.close(out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
