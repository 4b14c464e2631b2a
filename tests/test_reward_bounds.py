"""Red team, issue 42 §4–5: an agent that fills the disk, forks without bound, writes one huge file,
floods its output or hunts for the hidden tests and references (the tasks file's siblings, the
loop's output folder, the records DB, the generator replayed) gets nothing from it: each scores
no more than doing nothing, none is a failed rollout, and the host is unaffected.

The caps are small (8 MiB of disk, 48 processes) so every attack ends in a second or two; the
fork bomb is finite besides (2**9 processes at most, each alive a second), so it stays harmless
even where no process cap could be set — and then its test is skipped, not run uncapped."""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest

from harnessrl.app.sandbox.caps import OUTPUT_TAIL, pids_base
from harnessrl.app.sandbox.run import ROOT, Limits, Mounts, relay, run_limited

pytestmark = pytest.mark.skipif(not Path("/usr/bin/bwrap").exists(), reason="bubblewrap is not installed")
DISK, PROCS = 8 << 20, 48
CAPS = Limits(sandbox="bwrap", timeout=60, procs=PROCS, file_size=4 << 20, disk=DISK, output=256 << 10)
FILL = """
import os
for where in (".", os.environ["HOME"], os.environ["TMPDIR"], "/dev/shm"):
    try:
        with open(os.path.join(where, "fill"), "wb") as f:
            for i in range(48):  # 1 MiB files until the tmpfs is full; uncapped, 48 MiB a folder at most
                g = open(os.path.join(where, f"fill{i}"), "wb"); g.write(b"x" * (1 << 20)); g.close()
    except OSError as exc:
        print(where, type(exc).__name__, exc.errno)
raise SystemExit(1)  # the harness crashes on a full disk
"""
# the kernel exempts root from RLIMIT_NPROC: as root, only a pids cgroup caps a fork bomb
UNCAPPED_SKIP = pytest.mark.skipif(os.geteuid() == 0 and pids_base() is None,
                                   reason="no process cap can be set here: a fork bomb is not run uncapped")
BOMB = """
import os, time
for _ in range(9):
    os.fork()  # uncaught: a process whose fork fails crashes, the leader among them
time.sleep(1)
"""


@pytest.fixture
def ws() -> Path:
    ROOT.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="ws-bounds-", dir=ROOT))
    (path / "given.txt").write_text("the task's file")
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _run(code: str, ws: Path, limits: Limits = CAPS, out: Path | None = None, hidden: tuple[Path, ...] = ()):
    log = out or ws.with_name(ws.name + ".log")
    with relay(limits, []) as host, open(log, "w") as f:
        done = run_limited([sys.executable, "-c", textwrap.dedent(code)], dict(os.environ), limits,
                           Mounts(ws, hidden=hidden), host, f)
    return done, log.read_text(errors="replace")


def _size(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*"))


def test_a_full_disk_is_a_capped_run_and_the_host_keeps_at_most_the_cap(ws):
    done, out = _run(FILL, ws)
    assert done.code == 1 and not done.timed_out and done.capped == "disk", out
    assert out.count("OSError 28") == 4, out  # ENOSPC in the workspace, HOME, TMPDIR and /dev/shm alike
    assert (ws / "given.txt").read_text() == "the task's file"  # the workspace came back...
    assert 0 < _size(ws) <= DISK  # ...with what fitted in the cap: all the host wrote of it


def test_a_file_past_the_size_cap_fails_its_write_and_is_a_capped_run(ws):
    code = """
        import os
        try:
            open("big", "wb").write(b"x" * (5 << 20))
        except OSError as exc:
            print("write", exc.errno)  # EFBIG: the writer lives on
        raise SystemExit(2)
    """
    done, out = _run(code, ws)
    assert "write 27" in out and (done.code, done.capped) == (2, "file-size")
    assert (ws / "big").stat().st_size == 4 << 20


def test_the_output_the_host_keeps_is_bounded_with_its_end(ws, tmp_path):
    code = """
        import sys
        for i in range(200_000):
            print(f"line {i:06d} " + "y" * 40)
        print('{"reward": 1.0}')
    """
    done, out = _run(code, ws, out=tmp_path / "log")
    assert done.code == 0 and done.capped is None
    assert len(out.encode()) <= CAPS.output + 200  # the cap and the line that says what was left out
    assert out.startswith("line 000000 ") and out.rstrip().endswith('{"reward": 1.0}')
    assert "bytes of output left out (--max-output)" in out and OUTPUT_TAIL < CAPS.output


def _host_processes() -> int:
    return sum(1 for p in os.listdir("/proc") if p.isdigit())


@UNCAPPED_SKIP
def test_a_fork_bomb_stops_at_the_process_cap_and_leaves_nothing_on_the_host(ws):
    before, peak, stop = _host_processes(), [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _host_processes())
            stop.wait(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        done, out = _run(BOMB, ws)
    finally:
        stop.set()
        watcher.join()
    assert not done.timed_out and done.capped == "procs", out
    assert "Resource temporarily unavailable" in out  # fork failed (EAGAIN) at the cap
    assert peak[0] - before < PROCS + 100  # uncapped it would be 512 more (slack: other processes on the host)
    assert _host_processes() - before < 50  # and none of it is left behind


def test_hidden_folders_hold_nothing_the_sandbox_can_read_but_the_python_it_runs_on(ws, tmp_path):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("coding.jsonl", "train.jsonl", "eval.jsonl"):
        (tasks / name).write_text('{"reference": "secret"}\n')
    out_dir = tmp_path / "out"
    (out_dir / "r0" / "samples").mkdir(parents=True)
    (out_dir / "loop_state.json").write_text("{}")
    db = tmp_path / "elsewhere" / "runs.db"
    db.parent.mkdir()
    db.write_text("rewards")
    (db.parent / "notes.txt").write_text("not the DB: left readable")
    code = f"""
        import os
        for path in {[str(tasks), str(out_dir), str(db), str(tmp_path / "elsewhere" / "notes.txt")]!r}:
            try:
                print(path, sorted(os.listdir(path)) if os.path.isdir(path) else repr(open(path).read()))
            except OSError as exc:
                print(path, type(exc).__name__)
    """
    from harnessrl.app.sandbox.run import db_files

    done, out = _run(code, ws, hidden=(tasks, out_dir, *db_files(str(db))))
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    assert done.code == 0, out
    assert lines[str(tasks)] == lines[str(out_dir)] == "[]"
    assert lines[str(db)] in ("''", "PermissionError")  # /dev/null bound over it
    assert lines[str(tmp_path / "elsewhere" / "notes.txt")] == "'not the DB: left readable'"


def test_a_hidden_folder_that_holds_what_the_sandbox_runs_hides_everything_else_in_it(ws, tmp_path, monkeypatch):
    """Tasks kept beside the project (`--tasks coding.jsonl` in the repository): the folder is
    hidden entry by entry; the folders on PATH (here proj/bin), the Python, harnessrl and
    dot-folders (.venv) are left."""
    proj = tmp_path / "proj"
    for folder in ("bin", ".venv", "runs"):
        (proj / folder).mkdir(parents=True)
    (proj / "bin" / "tool").write_text("#!/bin/sh\necho tool ran\n")
    (proj / "bin" / "tool").chmod(0o755)
    (proj / "eval.jsonl").write_text("secret")
    (proj / "runs" / "runs.db").write_text("secret")
    monkeypatch.setenv("PATH", f"{proj / 'bin'}{os.pathsep}{os.environ['PATH']}")
    code = f"""
        import os, subprocess, harnessrl.harness_examples.coding.agent  # what the sandbox runs: importable
        print("entries", sorted(os.listdir({str(proj)!r})))
        print("runs", os.listdir({str(proj / "runs")!r}))
        try:
            print("eval", repr(open({str(proj / "eval.jsonl")!r}).read()))
        except OSError as exc:
            print("eval", type(exc).__name__)  # /dev/null, bound on a nodev mount
        print(subprocess.run(["tool"], capture_output=True, text=True).stdout.strip())
    """
    done, out = _run(code, ws, hidden=(proj,))
    assert done.code == 0, out
    assert "runs []" in out and "eval PermissionError" in out and "tool ran" in out
    assert "entries ['.venv', 'bin', 'eval.jsonl', 'runs']" in out  # the names stay
    assert (proj / "eval.jsonl").read_text() == "secret"  # on the host: untouched


# ---- end to end: `loop --cmd`'s runner (cmd_harness) on generated tasks, the proxy on the tiny model ----

AGENT = """
import json, os, sqlite3, sys, time
mode, task_file, root, cache = sys.argv[1:5]
task = json.load(open(task_file))
if mode == "fill":
    for where in (".", os.environ["HOME"], os.environ["TMPDIR"]):
        try:
            for i in range(48):
                with open(os.path.join(where, f"fill{i}"), "wb") as g:
                    g.write(b"x" * (1 << 20))
        except OSError:
            pass
    sys.exit(1)  # a harness that crashes on the full disk
if mode == "bomb":
    for _ in range(9):
        os.fork()
    time.sleep(1)
if mode == "plant-bomb":  # the fork bomb waits for the test run: the package forks when imported
    pkg = next(p for p in os.listdir(".") if os.path.isfile(os.path.join(p, "__init__.py")))
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write("import os, time\\nfor _ in range(9):\\n    os.fork()\\ntime.sleep(1)\\n")
if mode == "hunt":  # every place the hidden tests or the reference could be read from
    found = []
    def rows_in(text, path):
        for line in text.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and row.get("id") == task["id"] and row.get("reference"):
                found.append(row["reference"])
                print("in", path)
    for top in (os.path.join(root, "tasks"), os.path.join(root, "out-hunt"), root):
        for folder, _, files in os.walk(top):
            for name in files:
                path = os.path.join(folder, name)
                try:
                    if name.endswith(".db"):
                        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
                        for (ref,) in db.execute("select reference from tasks where id = ?", (task["id"],)):
                            found.append(json.loads(ref) if isinstance(ref, str) else ref)
                            print("in", path)
                    else:
                        rows_in(open(path, errors="replace").read(), path)
                except Exception:
                    pass
    # the host's harnessrl cache: known tests named by their cases would give the answers in order
    print("cache", sum(len(files) for _, _, files in os.walk(cache)))
    try:  # the installed generator, with the seed the tasks were made with (its templates hold the fixes)
        from harnessrl.harness_examples.coding.tasks import generate
        for salt in (None, "", "0", "5"):
            found += [r["reference"] for r in generate(4, 0, seed=5, salt=salt)[0] if r["id"] == task["id"]]
    except Exception as exc:
        print("generator", type(exc).__name__)
    import subprocess, harnessrl.harness_examples.coding as family  # its source, bytecode, the checkout's git
    folder = family.__path__[0]
    cached = os.path.join(folder, "__pycache__")
    compiled = [os.path.join(cached, n) for n in os.listdir(cached)] if os.path.isdir(cached) else []
    for path in [os.path.join(folder, "tasks.py"), os.path.join(folder, "templates.py"), *compiled]:
        try:
            if b"TEMPLATES" in open(path, "rb").read():
                print("source in", path)
        except OSError:
            pass
    shown = subprocess.run(["git", "-C", folder, "show", "HEAD:harness_examples/coding/templates.py"],
                           capture_output=True, text=True)
    if "TEMPLATES" in shown.stdout:
        print("source in git")
    found = [ref for ref in found if isinstance(ref, dict) and all(os.path.isfile(p) for p in ref)]  # this task's
    print("found", len(found))
    for ref in found:
        for path, text in ref.items():
            open(path, "w").write(text)
"""


@pytest.fixture(scope="module")
def coding(tiny_model_dir, tmp_path_factory):
    from harnessrl.harness_examples.coding.tasks import write
    from harnessrl.proxy.server import ProxyConfig, run_proxy
    from harnessrl.tasks_file import read_tasks

    root = tmp_path_factory.mktemp("bounds")
    files = write(root / "tasks", 1, 0, seed=5)  # a fresh salt, as `harnessrl tasks coding` draws
    (root / "agent.py").write_text(AGENT)
    db = root / "runs.db"
    with run_proxy(ProxyConfig(db=str(db), backend="local", model=str(tiny_model_dir), port=0)) as proxy:
        from harnessrl.compiler.tasks import import_tasks

        import_tasks(str(db), files["all"])  # as the loop does: the references are in the DB too
        yield {"url": proxy.url, "db": db, "tasks": files["all"], "rows": read_tasks(files["all"]), "root": root}


def _rollout(s, mode: str):
    from harnessrl.app.rollouts.cmd_harness import cmd_harness
    from harnessrl.app.rollouts.harnesses import TaskSource
    from harnessrl.app.rollouts.limited_run import RolloutFlags
    from harnessrl.app.sandbox.run import db_files

    flags = RolloutFlags(sandbox="bwrap", timeout=120, procs=PROCS, file_size=4 << 20, disk=DISK)
    src = TaskSource(s["tasks"], None, s["root"] / f"out-{mode}", 8, 0.0, 0)
    from harnessrl.app.sandbox.run import private_cache

    h = cmd_harness(f"{sys.executable} {s['root'] / 'agent.py'} {mode} {{task}} {s['root']} {private_cache()}", src,
                    None, False, flags, hidden=db_files(str(s["db"])))
    return h.run(s["url"], s["rows"][0], f"g-{mode}", f"run-{mode}", 1.0)


@UNCAPPED_SKIP
def test_no_attack_scores_more_than_doing_nothing_or_fails_its_rollout(coding):
    nothing = _rollout(coding, "nothing")
    assert nothing.error is None and 0 < nothing.outcome < 1  # the bug task: some hidden cases pass as given
    for mode in ("fill", "bomb", "plant-bomb", "hunt"):
        result = _rollout(coding, mode)
        assert result.error is None, (mode, result.error)  # scored: never a failed rollout
        assert result.outcome <= nothing.outcome, (mode, result.outcome, nothing.outcome)
        if mode in ("fill", "bomb"):
            assert result.metrics.get("capped") == 1.0, mode
    log = next((coding["root"] / "out-hunt").rglob("*.log")).read_text()
    assert "found 0" in log and "cache 0" in log and "source in" not in log, log  # nothing held the reference


def test_links_the_agent_made_come_back_as_links_and_nothing_is_written_through_them(ws, tmp_path):
    outside = tmp_path / "host-folder"
    outside.mkdir()
    code = f"""
        import os
        os.symlink({str(outside)!r}, "out")  # a folder of the host
        os.symlink("/etc/passwd", "passwd")
        os.makedirs("pkg"); open("pkg/mod.py", "w").write("x = 1")
        try:
            open("out/planted", "w").write("x")
        except OSError as exc:
            print("through", type(exc).__name__)  # the host folder is read-only in the sandbox
    """
    done, out = _run(code, ws)
    assert done.code == 0 and "through OSError" in out, out
    assert os.readlink(ws / "out") == str(outside) and os.readlink(ws / "passwd") == "/etc/passwd"
    assert (ws / "pkg" / "mod.py").read_text() == "x = 1"
    assert list(outside.iterdir()) == []


def test_as_root_without_a_pids_cgroup_a_process_cap_is_an_error_not_a_run_without_one(monkeypatch):
    from harnessrl.app.rollouts.cli import rollout_flags
    from harnessrl.app.sandbox import run as sandbox
    from harnessrl.errors import UserError

    monkeypatch.setattr(sandbox, "pids_base", lambda: None)
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    with pytest.raises(UserError, match=r"^--max-procs: as root no process cap can be set here .*--max-procs 0"):
        sandbox.check_limits(CAPS)
    sandbox.check_limits(Limits(sandbox="bwrap", procs=None))  # --max-procs 0: no cap, asked for
    with pytest.raises(UserError, match="--max-procs -1"):
        rollout_flags(None, None, "8G", 3600, None, "pass-fraction", procs=-1)
    with pytest.raises(UserError, match="--disk 'lots'"):
        rollout_flags(None, None, "8G", 3600, None, "pass-fraction", disk="lots")
    assert rollout_flags(None, None, "8G", 3600, None, "pass-fraction", procs=0, disk="0").procs is None


@pytest.mark.skipif(pids_base() is None, reason="no pids cgroup can be made here")
def test_a_cgroup_left_by_a_killed_host_process_is_removed_by_the_next_rollout():
    import subprocess

    from harnessrl.app.sandbox.caps import PidsCgroup

    dead = subprocess.Popen(["/bin/true"])
    dead.wait()
    stale = pids_base() / f"harnessrl-{dead.pid}-left"
    stale.mkdir()
    fresh = PidsCgroup(pids_base(), 64)
    try:
        assert not stale.exists() and fresh.path.exists()
    finally:
        fresh.close()
        if stale.exists():
            stale.rmdir()
    assert not fresh.path.exists()


@pytest.mark.skipif(pids_base() is None, reason="no pids cgroup can be made here")
def test_threads_that_start_rollouts_at_once_all_find_the_pids_cgroup():
    """Known-test runs and rollouts start on several threads at once: the first look for the pids
    cgroup must not fail on some of them (it did, in CI, as 'no pids cgroup can be made')."""
    import threading

    from harnessrl.app.sandbox import caps as sandbox_caps

    expected = pids_base()
    for _ in range(5):
        sandbox_caps._find_pids_base.cache_clear()
        start, found = threading.Barrier(8), []

        def look() -> None:
            start.wait()
            found.append(sandbox_caps.pids_base())

        threads = [threading.Thread(target=look) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert found == [expected] * 8
