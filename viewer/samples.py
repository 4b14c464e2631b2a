"""Reading a compile output (`samples.parquet`) for the pages: the columns are read by name, one
rollout or group at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from harnessrl.errors import UserError

COLUMNS = ["sample_id", "rollout_id", "group_id", "agent", "session_id", "input_ids", "loss_mask", "token_class",
           "advantage", "call_ids", "prompt_len", "outcome_reward"]


class Samples:
    """`samples.parquet` of a compile output directory (or the file itself). The rollout ids of
    each row group are indexed once, so a page reads only the row groups that hold its rollouts
    (the compiler writes a rollout's samples together, a few million tokens per group)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        self.path = path / "samples.parquet" if path.is_dir() else path
        if not self.path.is_file():
            raise UserError(f"--samples {path}: no samples.parquet there (run `harnessrl compile` first)")
        try:
            self.file = pq.ParquetFile(self.path)
        except pa.ArrowException as exc:
            raise UserError(f"--samples {self.path}: not a Parquet file ({exc})") from None
        missing = set(COLUMNS) - set(self.file.schema_arrow.names)
        if missing:
            raise UserError(f"{self.path} is not a compile output: no column {sorted(missing)[0]!r}")
        self.groups: dict[str, list[int]] = {}
        for g in range(self.file.num_row_groups):
            for rid in pc.unique(self.file.read_row_group(g, columns=["rollout_id"]).column(0)).to_pylist():
                self.groups.setdefault(rid, []).append(g)

    def _read(self, rollout_ids: list[str]) -> list[dict[str, Any]]:
        groups = sorted({g for rid in rollout_ids for g in self.groups.get(rid, [])})
        wanted = pa.array(rollout_ids, type=pa.string())
        out: list[dict[str, Any]] = []
        for g in groups:
            table = self.file.read_row_group(g, columns=COLUMNS)
            out += table.filter(pc.is_in(table.column("rollout_id"), value_set=wanted)).to_pylist()
        return out

    def of_rollout(self, rollout_id: str) -> list[dict[str, Any]]:
        return self._read([rollout_id])

    def advantages_of(self, rollout_ids: list[str]) -> dict[str, list[float]]:
        """Per rollout, the mean advantage over the trained tokens of each of its samples (one
        number per sample: GRPO gives every trained token of a sample the same advantage)."""
        out: dict[str, list[float]] = {}
        for row in self._read(rollout_ids):
            mask = np.asarray(row["loss_mask"], dtype=bool)
            adv = np.asarray(row["advantage"], dtype=np.float64)
            out.setdefault(row["rollout_id"], []).append(float(adv[mask].mean()) if mask.any() else 0.0)
        return out
