"""Opening the records DB: a SQLite file (WAL) by default, PostgreSQL by URL; migrations on open."""

from __future__ import annotations

import re
import threading
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

import harnessrl
from harnessrl.errors import UserError


class DBError(UserError):
    """A records DB that cannot be opened or migrated (reported as a one-line CLI error)."""


def db_url(target: str) -> str:
    """`runs.db` → `sqlite:///runs.db`; URLs (`postgresql+psycopg://…`) pass through."""
    if "://" in target:
        return target
    return f"sqlite:///{Path(target).expanduser()}"


def shown_db(target: str) -> str:
    """`target` as it may be printed or logged: a URL's password as `***`."""
    if "://" not in target:
        return target
    try:
        return make_url(target).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: mask what looks like user:password@
        return re.sub(r"(://[^/@:]*:)[^@/]*@", r"\1***@", target)


def sqlite_file(engine: Engine) -> Path | None:
    """The file of a SQLite engine's database; None for PostgreSQL or an in-memory SQLite DB."""
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return None
    return Path(engine.url.database)


# The size a SQLite WAL is cut back to when it restarts. A reader of an old snapshot (a long
# compile on a live DB) keeps the WAL from restarting, so it grows meanwhile; without a limit the
# file would keep that size for good.
WAL_LIMIT_BYTES = 64 * 1024 * 1024


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    # WAL + synchronous=NORMAL: a commit survives a killed process (SIGKILL); busy_timeout
    # lets the compiler read while the proxy writes.
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(target: str, lock_timeout_s: float | None = None, statement_timeout_s: float | None = None) -> Engine:
    """An engine for `target`. On PostgreSQL, `lock_timeout_s` / `statement_timeout_s` bound how long
    any statement may wait for a row lock / run (the proxy sets both: one stuck lock or query must
    not stall its writer); None leaves the server's setting (the compiler's long reads)."""
    url = db_url(target)
    if url.startswith("sqlite"):
        path = url.split(":///", 1)[-1]
        if path and path != ":memory:":
            parent = Path(path).parent
            if not parent.exists():
                raise DBError(f"directory for the DB does not exist: {parent}")
        engine = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # a server that vanishes (failover, partition) must not hang a connect or the recorder's
    # writer on a dead socket: bounded connects, TCP keepalives (~60 s to notice)
    parsed = make_url(url)
    libpq = parsed.get_driver_name() in ("psycopg", "psycopg2")
    args = dict(_PG_CONNECT) if libpq else {}
    settings = [f"-c {name}={int(s * 1000)}" for name, s in (("lock_timeout", lock_timeout_s),
                                                            ("statement_timeout", statement_timeout_s)) if s]
    if libpq and settings:
        # libpq `options`, merged with any the URL already has (e.g. a search_path)
        args["options"] = " ".join([*filter(None, [parsed.query.get("options")]), *settings])
    return create_engine(url, pool_pre_ping=True, connect_args=args)


_PG_CONNECT = {"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
               "keepalives_count": 3}  # libpq parameters (psycopg, psycopg2)


def _script_location() -> str:
    # `alembic/` has no __init__.py on purpose (it would shadow the alembic library when
    # run from the repo root), so it is found by path: beside the package in a checkout,
    # inside it (harnessrl/migrations) in a built wheel.
    root = Path(harnessrl.__file__).resolve().parent
    for candidate in (root.parent / "alembic", root / "migrations"):
        if (candidate / "env.py").exists():
            return str(candidate)
    raise DBError("the records DB migrations (alembic/) are missing from this installation")


# Alembic's `context` and `op` are module-level proxies bound for the run of one migration: two
# upgrades at once on two threads (an async loop's compile and a pinned evaluation's proxy) clobber
# each other's ("'script'", "table alembic_version already exists"). One at a time in a process.
_UPGRADE_LOCK = threading.Lock()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the Alembic migrations up to `revision` on this engine."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", _script_location())
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":  # a migration may lock and rewrite big tables
                conn.exec_driver_sql("SET LOCAL lock_timeout = 0")
                conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
                # proxies started together on one DB take turns: the next finds the schema at head
                # (an advisory lock of this transaction, keyed by the schema it migrates)
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext(current_schema()))")
            cfg.attributes["connection"] = conn
            with _UPGRADE_LOCK:
                command.upgrade(cfg, revision)
    except Exception as exc:  # noqa: BLE001 - surfaced as one line to the user
        raise DBError(f"cannot open or migrate the records DB {engine.url!r}: {exc}") from exc


def open_db(target: str, migrate: bool = True, lock_timeout_s: float | None = None,
            statement_timeout_s: float | None = None) -> tuple[Engine, sessionmaker[Session]]:
    """Engine and session factory for a DB path or URL, migrated to head (timeouts: `make_engine`)."""
    engine = make_engine(target, lock_timeout_s, statement_timeout_s)
    if migrate:
        upgrade(engine)
    return engine, sessionmaker(engine, expire_on_commit=False)
