"""The records DB: migrations, compact arrays, round trips on SQLite and PostgreSQL."""

import numpy as np
from sqlalchemy import inspect, select

from harnessrl.db import DBError, open_db
from harnessrl.records import Call, Rollout, pack_ids, pack_logprobs, unpack_ids, unpack_logprobs


def test_migrations_create_every_table(db_target):
    engine, _ = open_db(db_target)
    names = set(inspect(engine).get_table_names())
    assert {"tasks", "rollouts", "calls", "rewards", "expert_traces", "weight_versions", "alembic_version"} <= names
    open_db(db_target)  # idempotent: a second upgrade is a no-op


def test_call_round_trip_keeps_exact_arrays(db_target):
    _, Session = open_db(db_target)
    ids = [5, 0, 2047, 123456]
    lps = [-0.25, -1.5, 0.0, -13.0]
    with Session.begin() as s:
        s.add(Rollout(id="r1", status="running", next_seq=1, created_at=1.0))
        s.flush()
        s.add(Call(id="c1", rollout_id="r1", seq=0, endpoint="chat", request={"messages": []}, status="ok",
                   prompt_ids=pack_ids(ids), completion_ids=pack_ids(ids[:2]), completion_logprobs=pack_logprobs(lps),
                   created_at=1.0))
    with Session() as s:
        call = s.scalars(select(Call)).one()
        assert unpack_ids(call.prompt_ids).tolist() == ids
        assert unpack_ids(call.completion_ids).tolist() == ids[:2]
        np.testing.assert_array_equal(unpack_logprobs(call.completion_logprobs), np.array(lps, dtype=np.float32))
        assert len(call.prompt_ids) == 4 * len(ids)  # binary int32, not JSON text


def test_sqlite_is_wal(tmp_path):
    engine, _ = open_db(str(tmp_path / "w.db"))
    with engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_missing_directory_is_a_clear_error(tmp_path):
    import pytest

    with pytest.raises(DBError, match="does not exist"):
        open_db(str(tmp_path / "nope" / "runs.db"))


def test_alembic_head_is_the_orm_schema(db_target):
    """One definition of each table: the migrations at head build exactly the ORM's tables,
    columns, types, nullability, indexes and keys (autogenerate finds nothing to add)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from harnessrl.records import Base

    engine, _ = open_db(db_target)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        assert compare_metadata(ctx, Base.metadata) == []
