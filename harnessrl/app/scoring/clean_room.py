"""The clean room a coding rollout is scored in: a fresh copy of the task's pristine workspace,
the agent's version of its solution surface only, then the hidden tests.

The solution surface is what a policy may change: a task's `solution` paths (relative to the
workspace), by default its top-level Python packages (docs/coding.md, "What the reward trusts").
Everything else — tests, runner configuration, the top level — is the task's own by construction.
Inside the surface, paths the test runner trusts are never taken from the agent: a `conftest.py`,
a pytest/tox/setup.cfg/pyproject configuration, a module named like the runner or its plugins
(`pytest.py`, `_pytest/`, `pluggy/`), `sitecustomize`/`usercustomize`, `.pth` files, bytecode
(`__pycache__/`, `.pyc`), test files and `hidden_tests/`; where the task has its own, the task's
is laid back.

The copy never follows a link the agent made: every step is an `openat` with O_NOFOLLOW under a
directory descriptor already opened that way, so a link (or a swap of a checked path for one, by
a process left behind under `--sandbox none`) is left out, never read through; anything that is
not a plain file or folder (a FIFO, a device, a socket) is left out; and the copy is bounded in
files, bytes and depth (`SurfaceError`: the policy's failure, scored 0). The host writes only
into a folder it has just made, under names that are single path components.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from harnessrl.errors import UserError

HIDDEN_DIR = "hidden_tests"
RUNNER_NAMES = frozenset({"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "sitecustomize.py",
                          "usercustomize.py", "pytest.py", "py.py", "_pytest", "pluggy", "__pycache__", "tests", "test",
                          HIDDEN_DIR})
RUNNER_SUFFIXES = (".pth", ".pyc", ".pyo", "_test.py")
MAX_FILES, MAX_BYTES, MAX_DEPTH = 5000, 64 << 20, 32  # of one rollout's surface
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: opening a FIFO must not hang the host


class SurfaceError(Exception):
    """The agent's surface cannot be taken (too many files, too large, too deep)."""


def runner_owned(name: str) -> bool:
    """A path component the test run trusts: never the agent's."""
    return name in RUNNER_NAMES or name.endswith(RUNNER_SUFFIXES) or (name.startswith("test_") and name.endswith(".py"))


def _top_level(tree: Any) -> dict[str, bool]:
    """The top-level names of a tree, each with whether it is a folder holding `__init__.py`."""
    if isinstance(tree, Path):
        return {p.name: (p / "__init__.py").is_file() for p in tree.iterdir() if not p.is_symlink()}
    out: dict[str, bool] = {}
    for name in tree:
        parts = PurePosixPath(name).parts
        out[parts[0]] = out.get(parts[0], False) or parts[1:] == ("__init__.py",)
    return out


def solution_surface(declared: list[str] | None, workspace: Any, where: str) -> tuple[str, ...]:
    """The checked surface: the declared paths, else the workspace's top-level packages, else its
    top-level modules. One line for a surface that would hand the agent what the runner trusts."""
    if declared is None:
        top = {n: pkg for n, pkg in _top_level(workspace).items() if not runner_owned(n)}
        found = sorted(n for n, pkg in top.items() if pkg) or sorted(n for n in top if n.endswith(".py"))
        if not found:
            raise UserError(f"{where}: no Python package or module at the workspace's top level: name what the "
                            "agent may change with the task's `solution` field (e.g. [\"mypkg\"])")
        return tuple(found)
    for path in declared:
        parts = PurePosixPath(path).parts
        if not parts or parts[0] in ("/", ".") or ".." in parts or any(runner_owned(p) for p in parts):
            raise UserError(f"{where}: solution path {path!r}: a relative path inside the workspace, not the "
                            "workspace itself, its tests or a file the test runner reads")
    return tuple(declared)


class _Copy:
    def __init__(self) -> None:
        self.files = self.bytes = 0
        self.left_out: list[str] = []

    def node(self, parent: int, name: str, dest: Path, rel: str, depth: int) -> None:
        try:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISDIR(mode):
            self.folder(parent, name, dest, rel, depth)
        elif stat.S_ISREG(mode):
            self.file(parent, name, dest, rel)
        else:
            self.left_out.append(f"{rel} (link or special file)")

    def folder(self, parent: int, name: str, dest: Path, rel: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise SurfaceError(f"the solution surface is deeper than {MAX_DEPTH} folders")
        try:
            fd = os.open(name, _DIR, dir_fd=parent)
        except OSError as exc:  # swapped for a link or removed since it was looked at
            self.left_out.append(f"{rel} ({os.strerror(exc.errno or errno.EIO)})")
            return
        try:
            dest.mkdir()
            with os.scandir(fd) as it:
                names = sorted(e.name for e in it)
            for child in names:
                if runner_owned(child):
                    self.left_out.append(f"{rel}/{child} (read by the test runner: the task's own is used)")
                else:
                    self.node(fd, child, dest / child, f"{rel}/{child}", depth + 1)
        finally:
            os.close(fd)

    def file(self, parent: int, name: str, dest: Path, rel: str) -> None:
        try:
            fd = os.open(name, _FILE, dir_fd=parent)
        except OSError as exc:
            self.left_out.append(f"{rel} ({os.strerror(exc.errno or errno.EIO)})")
            return
        with os.fdopen(fd, "rb") as src:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self.left_out.append(f"{rel} (not a plain file)")
                return
            self.files += 1
            if self.files > MAX_FILES:
                raise SurfaceError(f"the solution surface has more than {MAX_FILES} files")
            budget = MAX_BYTES - self.bytes
            data = src.read(budget + 1)
            if len(data) > budget:
                raise SurfaceError(f"the solution surface is larger than {MAX_BYTES >> 20} MiB")
        self.bytes += len(data)
        mode = 0o755 if st.st_mode & 0o100 else 0o644
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(out, "wb") as f:
            f.write(data)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _lay_owned(tree: Any, entry: str, dest: Path) -> None:
    """The task's own runner-trusted files under `entry` (its conftest.py, ...), laid back."""
    if isinstance(tree, Path):
        base = tree / entry
        if base.is_file():
            return
        for root, dirs, files in os.walk(base):
            for name in files:
                rel = Path(root, name).relative_to(tree)
                if any(runner_owned(p) for p in rel.relative_to(entry).parts):
                    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(tree / rel, dest / rel, follow_symlinks=False)
        return
    for name, text in tree.items():
        parts = PurePosixPath(name).parts
        n = len(PurePosixPath(entry).parts)
        if parts[:n] == PurePosixPath(entry).parts and any(runner_owned(p) for p in parts[n:]):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_text(text)


def take_surface(agent_ws: Path, surface: tuple[str, ...], pristine: Any, dest: Path) -> list[str]:
    """Replace each surface path of `dest` (a fresh copy of `pristine`) by the agent's version
    (absent if the agent removed it). Returns what was left out, one line each."""
    copy = _Copy()
    root = os.open(agent_ws, _DIR)
    try:
        for entry in surface:
            *folders, last = PurePosixPath(entry).parts
            _remove(dest / entry)
            (dest / entry).parent.mkdir(parents=True, exist_ok=True)
            fds, parent = [], root
            try:
                for part in folders:
                    parent = os.open(part, _DIR, dir_fd=parent)
                    fds.append(parent)
                copy.node(parent, last, dest / entry, entry, len(folders))
            except OSError as exc:  # a folder on the way is a link, a file or gone
                copy.left_out.append(f"{entry} ({os.strerror(exc.errno or errno.EIO)})")
            finally:
                for fd in fds:
                    os.close(fd)
            _lay_owned(pristine, entry, dest)
    finally:
        os.close(root)
    return copy.left_out


def fresh_dir(prefix: str, root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))
