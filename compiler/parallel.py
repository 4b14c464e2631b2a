"""`harnessrl compile --jobs N`: batches of whole groups compiled in worker processes.

A batch needs nothing from another batch (advantages are per group, and groups never span
batches), so each worker reads, scores and assembles its batches on its own DB connection and
hands back one Arrow table of samples per batch. The parent writes the tables in batch order —
the same rows in the same order as a one-process compile — and keeps at most `2 × jobs`
batches in flight, so memory stays bounded by the batch size.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

_worker: Any = None  # this worker process's Compiler


def _init(db: str, opts: Any) -> None:
    global _worker
    from harnessrl.compiler.pipeline import Compiler

    _worker = Compiler(db, opts)


def _run(batch: list) -> Any:
    from harnessrl.compiler.writer import rows_table

    c = _worker
    c.reader.load_tasks({t for _, t, _ in batch if t}, c.tasks)
    rows: list[dict[str, Any]] = []

    def add(row: dict[str, Any]) -> int:
        rows.append(row)
        return len(row["input_ids"])

    out = c.process_batch(batch, add)
    out.table = rows_table(rows) if rows else None
    return out


def map_batches(db: str, opts: Any, batches: list[list], jobs: int) -> Iterator[Any]:
    """Each batch's `BatchOut`, in batch order."""
    # fork shares the loaded modules and tokenizer for free, but is unsafe in a process with
    # other threads (a proxy in the same process); spawn then
    method = "fork" if threading.active_count() == 1 and "fork" in mp.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(jobs, mp.get_context(method), initializer=_init, initargs=(db, opts)) as pool:
        pending: list[Future] = []
        it = iter(batches)
        for batch in it:
            pending.append(pool.submit(_run, batch))
            if len(pending) >= 2 * jobs:
                break
        while pending:
            out = pending.pop(0).result()
            nxt = next(it, None)
            if nxt is not None:
                pending.append(pool.submit(_run, nxt))
            yield out
