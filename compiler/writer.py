"""Stage 5 of `harnessrl compile`: samples and tasks to Parquet.

Samples are buffered and written as row groups built from flat numpy arrays (one concatenation
per column per row group, no per-token Python), once `flush_tokens` tokens are pending.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from harnessrl.samples import SAMPLE_SCHEMA, TASK_SCHEMA
from harnessrl.compiler.traces import structure_trace


def write_tasks(path: Path, tasks: dict[str, dict[str, Any]], task_ids: set[str]) -> None:
    """tasks.parquet: the tasks that have samples (reference, reference calls, structured trace)."""
    rows: dict[str, list[Any]] = {k: [] for k in TASK_SCHEMA.names}
    for tid in sorted(task_ids):
        t = tasks.get(tid)
        if t is None:
            continue
        rows["task_id"].append(tid)
        rows["input"].append(json.dumps(t["input"]))
        rows["reference"].append(json.dumps(t["reference"]))
        rows["reference_calls"].append(json.dumps(t["reference_calls"]) if t["reference_calls"] is not None else None)
        rows["expert_trace"].append(json.dumps(structure_trace(t["expert_trace"])) if t["expert_trace"] else None)
    pq.write_table(pa.table(rows, schema=TASK_SCHEMA), path)


class SampleWriter:
    """Buffers samples and writes Parquet row groups built from flat numpy arrays."""

    def __init__(self, path: Path, flush_tokens: int):
        self.path = path
        self.flush_tokens = flush_tokens
        self.rows: list[dict[str, Any]] = []
        self.pending = 0
        # dictionary-encode the identity strings only: token lists are high-cardinality
        self.writer = pq.ParquetWriter(path, SAMPLE_SCHEMA, use_dictionary=[
            "rollout_id", "task_id", "group_id", "agent", "session_id", "weight_version"])

    def add(self, row: dict[str, Any]) -> int:
        self.rows.append(row)
        n = len(row["input_ids"])
        self.pending += n
        if self.pending >= self.flush_tokens:
            self.flush()
        return n

    def flush(self) -> None:
        if self.rows:
            rows, self.rows, self.pending = self.rows, [], 0
            self.writer.write_table(rows_table(rows))

    def write(self, table: pa.Table) -> None:
        """Write a table of samples built elsewhere (`rows_table`), after the pending ones."""
        self.flush()
        self.writer.write_table(table)

    def close(self) -> None:
        self.flush()
        self.writer.close()


def rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Samples → one Arrow table of `SAMPLE_SCHEMA`, from flat numpy arrays."""
    lengths = np.array([len(r["input_ids"]) for r in rows], dtype=np.int32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))

    def lst(name: str, typ: pa.DataType) -> pa.Array:
        flat = np.concatenate([r[name] for r in rows])
        return pa.ListArray.from_arrays(offsets, pa.array(flat, type=typ))

    blp_vals = np.concatenate([r["behaviour_logprob"][0] for r in rows])
    blp_valid = np.concatenate([r["behaviour_logprob"][1] for r in rows])
    blp = pa.ListArray.from_arrays(offsets, pa.array(blp_vals, type=pa.float32(), mask=~blp_valid))
    columns = {
        "input_ids": lst("input_ids", pa.int32()),
        "loss_mask": lst("loss_mask", pa.int8()),
        "token_class": lst("token_class", pa.int8()),
        "advantage": lst("advantage", pa.float32()),
        "behaviour_logprob": blp,
        "turn_index": lst("turn_index", pa.int16()),
    }
    arrays = [columns[f.name] if f.name in columns else pa.array([r[f.name] for r in rows], type=f.type)
              for f in SAMPLE_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=SAMPLE_SCHEMA)
