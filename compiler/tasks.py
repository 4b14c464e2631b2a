"""`harnessrl tasks import FILE.jsonl`: tasks and expert traces into the records DB.

The file's format is harnessrl.tasks_file's. The whole file is validated before anything is
written; re-importing a task replaces it and its imported trace.
"""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import delete

from harnessrl.db import open_db
from harnessrl.records import ExpertTrace, Task
from harnessrl.tasks_file import read_tasks

SOURCE = "tasks-import"


def import_tasks(db: str, path: Path) -> tuple[int, int]:
    """Write the file's tasks (and traces); returns (tasks, traces) written."""
    rows = read_tasks(path)
    _, make_session = open_db(db)
    now = time.time()
    with make_session.begin() as s:
        for r in rows:
            s.merge(Task(id=r.id, input=r.input, reference=r.reference, reference_calls=r.reference_calls,
                         meta=None, created_at=now))
        s.flush()
        ids = [r.id for r in rows]
        for i in range(0, len(ids), 500):
            s.execute(delete(ExpertTrace).where(ExpertTrace.task_id.in_(ids[i:i + 500]), ExpertTrace.source == SOURCE))
        s.add_all(ExpertTrace(task_id=r.id, messages=r.expert_trace, source=SOURCE, created_at=now)
                  for r in rows if r.expert_trace)
    return len(rows), sum(1 for r in rows if r.expert_trace)
