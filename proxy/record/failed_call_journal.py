"""The failed-call journal: calls answered 503 while the records DB is away, kept on local disk
until they are written.

A call the recorder cannot commit (the DB is away, or its rollout row stays locked) is answered
503, and its row, marked failed, must still reach the DB: training and the rollout's error count
need to know the attempt happened. Memory is no place for it (a long outage under load is
millions of rows; a killed proxy loses them), so the rows go to an append-only file of JSON
lines, fsynced once per batch before the batch's calls are answered. The writer thread writes
them back in chunks once the DB answers again; a journal left by a killed proxy is taken over by
the next one to start on the same DB. Writing back is idempotent: the call id is the key, a row
already in the DB is not written again, so a replay cut short and run again duplicates nothing.

Each process writes its own file, `<id>.jsonl`, and holds an exclusive `flock` on `<id>.lock`
while it lives; a journal whose lock can be taken belongs to no live process and is adopted (its
rows appended to the adopter's journal, then its files removed). A fully written journal is cut
back to empty (the rows found locked are kept: rewritten, then retried a second later).

Bound: when the rows waiting reach `max_bytes`, `full` turns true and the proxy refuses new model
calls with the same 503 `database_unavailable` the DB's absence already gives them, before they
reach the model (a call that cannot be recorded should not spend the upstream's time). Calls
already running are still journaled, so the file may pass the bound by what was in flight, and
no failed call is dropped. Only an error writing the file itself (disk full, permissions) loses
rows; they are counted and logged.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import logging
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import URL, LargeBinary, make_url

from harnessrl.proxy.record.call_rows import CALLS, CallRecord

log = logging.getLogger("harnessrl.proxy.recorder")

DEFAULT_MAX_BYTES = 1024 * 1024 * 1024
RETRY_LOCKED_S = 1.0  # how soon rows whose rollout row was locked are tried again
_BINARY = {c.name for c in CALLS.columns if isinstance(c.type, LargeBinary)}
_FIELDS = [c.name for c in CALLS.columns if c.name != "seq"]


def default_dir(url: URL | str, spill_dir: str | Path | None = None) -> Path:
    """Where the journals of DB `url` live: `DB-spill/` beside a SQLite file, else a folder named
    for the DB under `spill_dir` (default `$XDG_STATE_HOME/harnessrl/spill`, i.e.
    `~/.local/state/harnessrl/spill`). Keyed by the DB, so that one proxy never writes another
    DB's failed calls into its own."""
    url = make_url(url)
    if spill_dir is None and url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        db = Path(url.database).expanduser().resolve()
        return db.with_name(db.name + "-spill")
    if spill_dir is None:
        state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
        spill_dir = Path(state) / "harnessrl" / "spill"
    # the password is no part of the DB's identity (and must not be on disk)
    ident = url._replace(password=None).render_as_string(hide_password=False)  # URL is a NamedTuple
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{url.get_backend_name()}-{Path(url.database or 'memory').name}")
    return Path(spill_dir).expanduser() / f"{name}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def _encode(rec: CallRecord) -> bytes:
    row = {}
    for name in _FIELDS:
        value = getattr(rec, name)
        row[name] = base64.b64encode(value).decode() if name in _BINARY and value is not None else value
    try:
        return orjson.dumps(row) + b"\n"
    except TypeError:  # an integer past 64 bits in a request (the stdlib writes any integer)
        return json.dumps(row, ensure_ascii=False).encode() + b"\n"


def _decode(line: bytes) -> CallRecord:
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        row = json.loads(line)
    for name in _BINARY:
        if row.get(name) is not None:
            row[name] = base64.b64decode(row[name])
    return CallRecord(**row)


class Spill:
    """One process's journal in `directory`; used by the recorder's writer thread only (the
    event loop reads `full`, `rows` and `bytes`: plain attribute reads)."""

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_MAX_BYTES, metrics: Any = None) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self._metrics = metrics  # counts rows dropped (journal write errors) and rows the DB refused
        self._name = uuid.uuid4().hex
        self._file = None  # opened on the first row: a proxy whose DB never fails leaves no trace
        self._lock_fd: int | None = None
        self._size = 0  # bytes in the file
        self._read_at = 0  # where the next row to write back starts
        self._taken_from = 0
        self._locked: list[CallRecord] = []  # written back but found locked: kept for the next pass
        self._not_before = 0.0
        self.rows = 0  # rows waiting to be written
        self.bytes = 0  # bytes of those rows
        self.full = False
        self.adopt()

    # appending (on the writer thread, before the calls are answered)
    def append(self, recs: list[CallRecord]) -> None:
        data = [_encode(r) for r in recs]
        try:
            self._open()
            self._file.write(b"".join(data))
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            log.error("recorder: cannot write failed calls %s to the journal in %s (%s): they are lost",
                      [r.id for r in recs], self.dir, exc)
            if self._metrics is not None:
                self._metrics.spill_dropped(len(recs))
            return
        n = sum(map(len, data))
        self._size += n
        self.rows += len(recs)
        self.bytes += n
        if not self.full and self.bytes >= self.max_bytes:
            self.full = True
            log.error("recorder: the failed-call journal is full (%d calls, %d bytes in %s, bound %d bytes): new "
                      "model calls are refused with 503 until the records DB is back and the journal drains",
                      self.rows, self.bytes, self.dir, self.max_bytes)

    # writing back
    def due(self) -> bool:
        return self.rows > 0 and time.monotonic() >= self._not_before

    def wait_s(self) -> float | None:
        """Seconds until rows are due to be written back (None: the journal is empty)."""
        return None if not self.rows else max(self._not_before - time.monotonic(), 0.0)

    def take(self, n: int) -> list[CallRecord]:
        """The next (up to) `n` rows to write back; `settle` or `untake` must follow."""
        self._taken_from = self._read_at
        if self._file is None:
            return []
        self._file.seek(self._read_at)
        recs = []
        while len(recs) < n and self._read_at < self._size:
            line = self._file.readline()
            self._read_at += len(line)
            try:
                recs.append(_decode(line))
            except (ValueError, TypeError) as exc:  # the file was damaged on disk: this row is gone
                log.error("recorder: an unreadable row in the journal %s (%s) is lost", self._path, exc)
                self.rows -= 1
                if self._metrics is not None:
                    self._metrics.spill_dropped(1)
        return recs

    def untake(self) -> None:
        """The rows taken were not written (the DB went away again)."""
        self._read_at = self._taken_from
        self._not_before = time.monotonic() + RETRY_LOCKED_S

    def settle(self, done: int, locked: list[CallRecord]) -> None:
        """Of the rows taken, `done` are in the DB (or refused by it for good) and `locked` wait."""
        self.rows -= done
        self.bytes = max(self._size - self._read_at, 0)
        self._locked += locked
        if self._read_at >= self._size:
            self._compact()
        if self.full and self.bytes < self.max_bytes // 2:
            self.full = False
            log.warning("recorder: the failed-call journal has room again (%d calls waiting): model calls "
                        "are taken again", self.rows)

    def _compact(self) -> None:
        # every row of the file was tried: keep only the locked ones, in a fresh file
        locked, self._locked = self._locked, []
        tmp = self.dir / f"{self._name}.tmp"
        with open(tmp, "wb") as f:
            f.write(b"".join(_encode(r) for r in locked))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)
        self._file.close()
        self._file = open(self._path, "a+b")  # noqa: SIM115 - held open for the process's life
        self._size = self._file.seek(0, os.SEEK_END)
        self._read_at = 0
        self.bytes = self._size
        if locked:
            self._not_before = time.monotonic() + RETRY_LOCKED_S

    # files
    @property
    def _path(self) -> Path:
        return self.dir / f"{self._name}.jsonl"

    def _open(self) -> None:
        if self._file is not None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / f"{self._name}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fd = os.open(self._path, os.O_CREAT | os.O_RDWR | os.O_APPEND, 0o600)
        self._file = os.fdopen(fd, "a+b")
        dfd = os.open(self.dir, os.O_RDONLY)  # the new file's name must survive a crash too
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def adopt(self) -> int:
        """Take over the journals of proxies no longer running (their lock is free); their rows
        join this journal. Returns how many rows were taken over."""
        if not self.dir.is_dir():
            return 0
        taken = 0
        # by data file: a journal exists only once its owner holds its lock
        for path in sorted(self.dir.glob("*.jsonl")):
            if path.stem == self._name:
                continue
            lock = path.with_suffix(".lock")
            fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its proxy is alive
                os.close(fd)
                continue
            try:
                taken += self._take_over(path)
                lock.unlink(missing_ok=True)
            finally:
                os.close(fd)
        if taken:
            log.warning("recorder: took over %d failed calls from the journal of a proxy that stopped in %s",
                        taken, self.dir)
        return taken

    def _take_over(self, path: Path) -> int:
        try:
            src = open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:  # adopted meanwhile by another proxy
            return 0
        n = 0
        with src:
            chunk: list[bytes] = []
            for line in src:
                try:
                    _decode(line)
                except (ValueError, TypeError):  # a line cut by the kill: its batch was never answered
                    log.warning("recorder: skipped an unreadable line in the journal %s (cut by a crash)", path)
                    continue
                chunk.append(line if line.endswith(b"\n") else line + b"\n")
                if len(chunk) >= 1024:
                    n += self._copy(chunk)
            n += self._copy(chunk)
        path.unlink()  # only once its rows are safe in this journal (a second copy is written once)
        return n

    def _copy(self, lines: list[bytes]) -> int:
        if not lines:
            return 0
        self._open()
        self._file.write(b"".join(lines))
        self._file.flush()
        os.fsync(self._file.fileno())
        size = sum(map(len, lines))
        self._size += size
        self.bytes += size
        self.rows += len(lines)
        n = len(lines)
        lines.clear()
        return n

    def close(self) -> None:
        """Rows still waiting stay on disk for the next proxy; an empty journal is removed."""
        if self._file is None:
            return
        self._file.close()
        self._file = None
        if not self.rows:
            self._path.unlink(missing_ok=True)
            (self.dir / f"{self._name}.lock").unlink(missing_ok=True)
        os.close(self._lock_fd)
        if not self.rows:
            try:
                self.dir.rmdir()  # only when no other journal is in it
            except OSError:
                pass
