"""The coding family's test reward, tried as a reward-hacking policy would (issue 42; helper
modules test the keys and the resource caps; the second round, issue 54, is test_red_team_round2.py).
Each case runs against the task's hidden tests as a pytest file and as data (calls.py). Every trick on the scoring scores no more than
doing nothing, none is a failed rollout, the host never writes through or reads through a link
the agent made, and the legitimate fix still scores 1. Most cases drive the scorer directly
(`score_rollout`, what `run_limited_rollout` calls after the harness) under bubblewrap; the
agent that waits for the test phase, the planted `hidden_tests` link and the fix also go end to
end through `loop --cmd`'s runner, and two through the Ray executor."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from harnessrl.app.rollouts.cmd_harness import cmd_harness
from harnessrl.app.rollouts.harnesses import TaskSource
from harnessrl.app.rollouts.limited_run import RolloutFlags, coding_tasks
from harnessrl.app.sandbox.run import ROOT, Limits
from harnessrl.app.scoring.hidden_tests import score_rollout
from harnessrl.app.scoring.workspace import fresh_workspace
from harnessrl.errors import UserError
from harnessrl.harness_examples.coding.tasks import write
from harnessrl.tasks_file import read_tasks

pytestmark = pytest.mark.skipif(not Path("/usr/bin/bwrap").exists(), reason="bubblewrap is not installed")

FORCE_PASS = """
import pytest

@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    report.outcome = "passed"
    return report
"""
SUMMARY = "print('11 passed in 0.01s', flush=True)\n"


def _make_task(tmp_path_factory, hidden: str):
    root = tmp_path_factory.mktemp(f"integrity-{hidden}")
    files = write(root / "tasks", 1, 0, seed=0, salt="integrity", hidden=hidden)
    [row] = read_tasks(files["all"])
    coding = coding_tasks([row], files["all"], RolloutFlags())[row.id]
    [(module, fixed)] = row.reference.items()
    t = {"task": coding, "row": row, "files": files, "root": root, "pkg": module.split("/")[0],
         "module": module, "fixed": fixed, "broken": row.workspace[module], "hidden": hidden}
    t["nothing"] = _score(t).reward
    return t


@pytest.fixture(scope="module", params=["pytest", "calls"])
def task(request, tmp_path_factory):
    """The generated task with its hidden tests as a pytest file (the clean room's runner) and as
    data (calls.py, the family's default): every first-round trick fails against both."""
    return _make_task(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def pytest_task(tmp_path_factory):
    return _make_task(tmp_path_factory, "pytest")


def _score(t, attack=None, sandbox="bwrap", mode="pass-fraction"):
    ws = fresh_workspace(t["task"])
    try:
        if attack is not None:
            attack(ws, t)
        return score_rollout(t["task"], ws, None, mode, Limits(sandbox=sandbox, timeout=60), ())
    finally:
        shutil.rmtree(ws, ignore_errors=True)


def _files(files: dict[str, str]):
    def attack(ws: Path, t) -> None:
        for name, text in files.items():
            name = name.format(pkg=t["pkg"], module=t["module"])
            (ws / name).parent.mkdir(parents=True, exist_ok=True)
            (ws / name).write_text(text)
    return attack


def _module_tail(code: str):
    def attack(ws: Path, t) -> None:
        (ws / t["module"]).write_text(t["broken"] + "\n" + code)
    return attack


def _init(code: str):
    return _files({"{pkg}/__init__.py": textwrap.dedent(code)})


def _pyc(ws: Path, t) -> None:
    """Bytecode of a module that passes, where the tests' import would find it."""
    import py_compile

    src = ws / "fixed_src.py"
    src.write_text(t["fixed"])
    stem = Path(t["module"]).stem
    for target in (ws / t["pkg"] / "__pycache__" / f"{stem}.{sys.implementation.cache_tag}.pyc",
                   ws / t["pkg"] / f"{stem}.pyc", ws / "hidden_tests" / "__pycache__" / "x.pyc"):
        target.parent.mkdir(parents=True, exist_ok=True)
        py_compile.compile(str(src), cfile=str(target))
    src.unlink()
    (ws / t["module"]).unlink()  # only the bytecode is left of the module


ATTACKS = {
    "root conftest.py hookwrapper": _files({"conftest.py": FORCE_PASS}),
    "package-level conftest.py": _files({"{pkg}/conftest.py": FORCE_PASS}),
    "pytest.py in the workspace": _files({"pytest.py": SUMMARY + "raise SystemExit(0)\n"}),
    "pytest.py and _pytest/ in the package": _files({"{pkg}/pytest.py": SUMMARY, "{pkg}/_pytest/__init__.py": ""}),
    "summary printed and os._exit(0) at import": _module_tail(SUMMARY + "import os\nos._exit(0)\n"),
    "summary printed and os._exit(0) from atexit": _module_tail(
        "import atexit, os\natexit.register(lambda: (print('11 passed in 0.01s', flush=True), os._exit(0)))\n"),
    "pytest.ini whose python_files match nothing": _files(
        {"pytest.ini": "[pytest]\npython_files = nothing_*.py\n", "{pkg}/pytest.ini": "[pytest]\npython_files = x\n",
         "tox.ini": "[pytest]\naddopts = --co\n",
         "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-k nothing'\n"}),
    "raise SystemExit(0) in the package": _init("raise SystemExit(0)\n"),
    "pytest.exit(returncode=0) at import": _module_tail("import pytest\npytest.exit('done', returncode=0)\n"),
    "the tests' module skipped from the package": _module_tail(
        "import pytest\npytest.skip('not today', allow_module_level=True)\n"),
    "__init__ patches builtins and the assertion rewriter": _init("""
        import builtins, _pytest.assertion.rewrite as rewrite
        builtins.AssertionError = type("AssertionError", (BaseException,), {})
        rewrite.AssertionRewritingHook.exec_module = lambda self, module: None
        """),
    "__init__ turns every test into a no-op": _init("""
        import _pytest.python
        _pytest.python.Function.runtest = lambda self: None
        """),
    "__init__ feeds parametrize the function's own answers": _init("""
        import importlib, pytest
        MarkGenerator = type(pytest.mark)
        real = MarkGenerator.__getattr__
        def patched(self, name):
            mark = real(self, name)
            if name != "parametrize":
                return mark
            def parametrize(names, cases, **kw):
                def apply(fn):
                    mod = importlib.import_module(fn.__module__)
                    target = [v for v in vars(mod).values()
                              if callable(v) and getattr(v, "__module__", "").startswith(__name__)][0]
                    return mark(names, [(args, target(*args)) for args, _ in cases], **kw)(fn)
                return apply
            return parametrize
        MarkGenerator.__getattr__ = patched
        """),
    "__init__ registers a plugin that passes every report": _init("""
        import gc, pytest
        class Pass:
            @pytest.hookimpl(wrapper=True)
            def pytest_runtest_makereport(self, item, call):
                report = yield
                report.outcome = "passed"
                return report
        config = next(o for o in gc.get_objects() if type(o).__name__ == "Config" and hasattr(o, "pluginmanager"))
        config.pluginmanager.register(Pass(), "pass-all")
        """),
    "__init__ replaces pytest in sys.modules": _init("""
        import sys, types
        sys.modules["pytest"] = types.ModuleType("pytest")
        """),
    "sitecustomize, usercustomize and a .pth": _files(
        {"sitecustomize.py": SUMMARY + "import os\nos._exit(0)\n", "{pkg}/sitecustomize.py": "import os\nos._exit(0)\n",
         "{pkg}/usercustomize.py": "import os\nos._exit(0)\n", "{pkg}/x.pth": "import os; os._exit(0)\n"}),
    "planted .pyc of a module that passes": _pyc,
    "tests of its own in hidden_tests/ and tests/": _files(
        {"hidden_tests/test_ok.py": "def test_ok():\n    pass\n",
         "{pkg}/tests/test_ok.py": "def test_ok():\n    pass\n", "{pkg}/test_ok.py": "def test_ok():\n    pass\n"}),
}


def test_doing_nothing_scores_the_broken_code_and_the_fix_scores_1(task):
    nothing = _score(task)
    assert nothing.metadata["report"] == {"pytest": "signed", "calls": "read"}[task["hidden"]]
    assert nothing.metadata["known"] == len(task["task"].known_tests)
    assert nothing.reward == nothing.metadata["passed"] / nothing.metadata["known"] < 1.0
    fixed = _score(task, _files({"{module}": task["fixed"]}))
    assert fixed.reward == 1.0 and fixed.metadata["passed"] == fixed.metadata["known"], fixed.metadata
    assert _score(task, _files({"{module}": task["fixed"]}), mode="all-pass").reward == 1.0
    # a new helper module inside the package is the agent's to add
    helper = {"{pkg}/extra.py": task["fixed"], "{module}": f"from .extra import *  # noqa\n"}
    assert _score(task, _files(helper)).reward == 1.0


@pytest.mark.parametrize("name", list(ATTACKS))
def test_an_attack_on_the_scoring_scores_no_more_than_doing_nothing(task, name):
    outcome = _score(task, ATTACKS[name])
    assert outcome.reward is not None and outcome.reward <= task["nothing"], (name, outcome.metadata)
    if "exit" in name.lower() or "no-op" in name:  # the ones that fake an exit code 0: all-pass pays nothing either
        assert _score(task, ATTACKS[name], mode="all-pass").reward == 0.0


def test_an_attack_with_the_fix_in_place_scores_0(pytest_task):
    """Tampering is not excused by a correct fix beside it: the run it tampered with is not trusted.
    (Under data tests the no-op does nothing to the verdict, and the fix is simply scored.)"""
    task = pytest_task
    def both(ws, t):
        (ws / t["module"]).write_text(t["fixed"])
        ATTACKS["__init__ turns every test into a no-op"](ws, t)
    outcome = _score(task, both)
    assert outcome.reward == 0.0 and "replaced" in outcome.metadata["zero"], outcome.metadata


def test_links_and_special_files_are_never_followed_by_the_host(task, tmp_path):
    secret = tmp_path / "secret.py"
    secret.write_text(task["fixed"])  # what a link would read through to
    outside = tmp_path / "outside"
    outside.mkdir()

    def links(ws, t):
        (ws / t["module"]).unlink()
        (ws / t["module"]).symlink_to(secret)
        (ws / "hidden_tests").symlink_to(outside)
        (ws / t["pkg"] / "sub").symlink_to(outside)
        os.mkfifo(ws / t["pkg"] / "pipe.py")  # opening it to read would hang a careless host
    outcome = _score(task, links)
    assert outcome.reward == 0.0 and any("link" in line for line in outcome.metadata["left_out"])
    assert list(outside.iterdir()) == []  # the host wrote nothing where the agent's link points


def test_an_oversized_surface_is_the_policys_zero(task, monkeypatch):
    import harnessrl.app.scoring.clean_room as clean_room

    monkeypatch.setattr(clean_room, "MAX_BYTES", 4096)
    outcome = _score(task, _files({"{pkg}/big.py": "x = 1\n" * 2000, "{module}": task["fixed"]}))
    assert outcome.reward == 0.0 and "larger than" in outcome.metadata["zero"]


def test_one_attack_without_a_sandbox(task):
    nothing = _score(task, sandbox="none").reward
    assert _score(task, ATTACKS["root conftest.py hookwrapper"], sandbox="none").reward <= nothing
    assert _score(task, _files({"{module}": task["fixed"]}), sandbox="none").reward == 1.0


def test_a_task_whose_hidden_tests_fail_on_its_reference_is_an_error_at_load(task, tmp_path):
    row = json.loads(task["files"]["all"].read_text().splitlines()[0])
    row["reference"] = {task["module"]: task["broken"]}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(row) + "\n")
    with pytest.raises(UserError, match="hidden tests do not pass on its reference"):
        coding_tasks(read_tasks(bad), bad, RolloutFlags())
    row["solution"] = ["conftest.py"]
    bad.write_text(json.dumps(row) + "\n")
    with pytest.raises(UserError, match="solution path 'conftest.py'"):
        coding_tasks(read_tasks(bad), bad, RolloutFlags())


def test_a_tasks_own_reward_cmd_runs_in_the_clean_room_without_the_rollouts_keys(pytest_task, monkeypatch, tmp_path):
    """Its reward is read from its output (the user's command, the user's to trust), but over the
    clean room and in an environment without the proxy's key or Python's variables."""
    task = pytest_task
    from dataclasses import replace

    from harnessrl.app.scoring.hidden_tests import score_in_place

    monkeypatch.setenv("OPENAI_API_KEY", "hrl-x-main:operator-secret")
    monkeypatch.setenv("PYTHONPATH", "/planted")
    cmd = f"env; PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -q -p no:cacheprovider hidden_tests"
    own = replace(task["task"], reward_cmd=cmd)
    limits = Limits(sandbox="bwrap", timeout=60)
    ws = fresh_workspace(own)
    try:
        _files({"conftest.py": FORCE_PASS})(ws, task)
        attacked = score_rollout(own, ws, cmd, "pass-fraction", limits, ())
        (ws / task["module"]).write_text(task["fixed"])
        fixed = score_rollout(own, ws, cmd, "pass-fraction", limits, ())
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    assert attacked.reward == pytest.approx(task["nothing"]) and fixed.reward == 1.0, attacked.metadata
    assert "operator-secret" not in attacked.metadata["output"] and "/planted" not in attacked.metadata["output"]
    # no pristine workspace (`harnessrl run --reward-cmd` in your own folder): scored where it is
    (tmp_path / "ok").write_text("")
    assert score_in_place(tmp_path, "test -f ok", "all-pass", limits, ()).reward == 1.0


# End to end: `loop --cmd`'s runner (a rollout, its harness in the sandbox, then the scoring)
WAITER = """
import os, subprocess, sys
# left behind: for 20 s it plants a pass-everything conftest.py wherever a workspace or clean room shows up
code = '''
import glob, os, time
end = time.time() + 20
while time.time() < end:
    for d in glob.glob("ROOT/*/") + [os.getcwd() + "/"]:
        try:
            open(d + "conftest.py", "w").write(%r)
        except OSError:
            pass
    time.sleep(0.05)
'''
subprocess.Popen([sys.executable, "-c", code % sys.argv[1]], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""
AGENT = """
import json, os, sys
mode, task_file, payload = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "fix":
    for path, text in json.loads(payload).items():
        open(path, "w").write(text)
elif mode == "link":
    os.symlink(payload, "hidden_tests")
"""


@pytest.fixture(scope="module")
def live(task):
    """A real proxy for the rollouts; the harnesses call no model, so its upstream is never dialled."""
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    root = task["root"]
    (root / "agent.py").write_text(AGENT)
    (root / "waiter.py").write_text(WAITER.replace("ROOT", str(ROOT)))
    with run_proxy(ProxyConfig(db=str(root / "runs.db"), upstream="http://127.0.0.1:9", port=0)) as proxy:
        yield proxy.url


def _harness(task, mode: str, payload: str, tag: str):
    root = task["root"]
    src = TaskSource(task["files"]["all"], None, root / f"out-{tag}", 8, 0.0, 0)
    quoted = payload.replace("'", "'\\''")
    if mode == "wait":
        template = f"{sys.executable} {root / 'waiter.py'} '{quoted}' {{task_id}}"
    else:
        template = f"{sys.executable} {root / 'agent.py'} {mode} {{task}} '{quoted}'"
    return cmd_harness(template, src, None, False, RolloutFlags(sandbox="bwrap", timeout=120))


def test_end_to_end_a_waiting_agent_a_hidden_tests_link_and_the_fix(task, live, tmp_path):
    nothing = task["nothing"]
    outside = tmp_path / "outside"
    outside.mkdir()
    row = task["row"]
    waited = _harness(task, "wait", FORCE_PASS, "wait").run(live, row, "g-wait", "run-wait", 1.0)
    linked = _harness(task, "link", str(outside), "link").run(live, row, "g-link", "run-link", 1.0)
    fixed = _harness(task, "fix", json.dumps(row.reference), "fix").run(live, row, "g-fix", "run-fix", 1.0)
    for result in (waited, linked):
        assert result.error is None and result.outcome is not None and result.outcome <= nothing, result
    assert list(outside.iterdir()) == []
    assert fixed.error is None and fixed.outcome == 1.0


@pytest.mark.ray
def test_under_ray_an_attack_scores_no_more_than_nothing_and_the_fix_1(task, live):
    from harnessrl.app.rollouts.executors import run_batch
    from harnessrl.app.rollouts.jobs import Job
    from harnessrl.app.rollouts.ray_rollouts import RayExecutor

    nothing = task["nothing"]
    row = task["row"]
    attack = _harness(task, "fix", json.dumps({"conftest.py": FORCE_PASS}), "ray-attack")
    fix = _harness(task, "fix", json.dumps(row.reference), "ray-fix")
    ex = RayExecutor(None, 2, 300)
    try:
        [attacked] = run_batch(ex, attack.run, live, [Job(row, row.id, "g-ray-a", "ray-a", 1.0)], "attack")
        [fixed] = run_batch(ex, fix.run, live, [Job(row, row.id, "g-ray-f", "ray-f", 1.0)], "fix")
    finally:
        ex.close()
    assert attacked.error is None and attacked.outcome <= nothing, attacked
    assert fixed.error is None and fixed.outcome == 1.0, fixed
