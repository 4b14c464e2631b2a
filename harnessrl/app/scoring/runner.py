"""The hidden tests' runner in the clean room (hidden_tests.py), run by path in a fresh sandbox:

    python -I runner.py IO_DIR WORKSPACE -- PYTEST_ARGS...

Standard library and pytest only, never imported by harnessrl. `-I`: no PYTHONPATH, no user
site, neither the working directory nor this file's folder on sys.path, so nothing in the
workspace can stand in for pytest or its plugins. Before pytest starts — so before any of the
workspace's code runs — it reads the scorer's one-time file IO_DIR/nonce (a random key and the
report's random name), unlinks it and opens the report file, keeping the descriptor. Only then is
the workspace put on sys.path (first, as `python -m pytest` would have it: its top level is the
task's own, hidden_tests.py laid it) and pytest run with `Reporter` as a plugin object: the collected
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


# pytest's own functions that turn a test into its outcome: code under test that replaces one of
# them (e.g. `Function.runtest` with a no-op) is seen at the next test's report
WATCHED = (("_pytest.python", "Function", "runtest"), ("_pytest.python", "Function", "setup"),
           ("_pytest.python", None, "pytest_pyfunc_call"), ("_pytest.runner", None, "call_and_report"),
           ("_pytest.runner", None, "runtestprotocol"), ("_pytest.runner", None, "call_runtest_hook"),
           ("_pytest.runner", None, "pytest_runtest_makereport"), ("_pytest.runner", None, "pytest_runtest_call"),
           ("_pytest.runner", "CallInfo", "from_call"), ("_pytest.reports", "TestReport", "from_item_and_call"),
           ("_pytest.reports", "TestReport", "__init__"))


def _watched() -> list:
    out = [sys.modules.get("pytest")]
    for module, owner, name in WATCHED:
        space = sys.modules[module] if owner is None else getattr(sys.modules[module], owner)
        out.append(vars(space).get(name))
    return out


def _params(item) -> str:
    """A digest of a test's parameters: parametrize patched to feed it other cases shows here."""
    spec = getattr(item, "callspec", None)
    text = repr(sorted(spec.params.items())) if spec is not None else ""
    return "" if " at 0x" in text else hashlib.sha256(text.encode()).hexdigest()[:16]  # an address changes each run


class Reporter:
    """pytest's own per-test reports, as they happen, and what would show they were tampered with."""

    def __init__(self) -> None:
        self.collected: list[str] = []
        self.params: dict[str, str] = {}
        self.outcomes: dict[str, dict[str, str]] = {}  # node id -> {phase: passed | failed | skipped | xfail}
        self.tampered: list[str] = []
        self.final_hooks: list[str] | None = None
        self._watch = _watched()

    def _check(self, where: str) -> None:
        if not self.tampered and any(a is not b for a, b in zip(_watched(), self._watch)):
            self.tampered.append(f"pytest's own functions were replaced (seen at {where})")

    def pytest_collection_finish(self, session) -> None:
        self._check("collection")
        self.collected = [item.nodeid for item in session.items]
        self.params = {item.nodeid: _params(item) for item in session.items}

    def pytest_runtest_logreport(self, report) -> None:
        self._check(report.nodeid)
        outcome = "xfail" if hasattr(report, "wasxfail") else report.outcome
        self.outcomes.setdefault(report.nodeid, {})[report.when] = outcome

    def hooks(self, config) -> list[str]:
        """Every hook implementation by module and name: a plugin registered by the code under test shows."""
        return sorted(f"{name}:{impl.function.__module__}.{impl.function.__qualname__}"
                      for name, caller in vars(config.pluginmanager.hook).items() if hasattr(caller, "get_hookimpls")
                      for impl in caller.get_hookimpls())

    def pytest_unconfigure(self, config) -> None:
        self._check("the end")
        self.final_hooks = self.hooks(config)


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
    payload = json.dumps({"exitstatus": code, "collected": reporter.collected, "outcomes": reporter.outcomes,
                          "params": reporter.params, "hooks": reporter.final_hooks,
                          "tampered": reporter.tampered})
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
