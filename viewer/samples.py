"""Reading a compile output (`samples.parquet`) for the pages: the columns are read by name, one
rollout or group at a time (a row filter, not the whole file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from harnessrl.errors import UserError

COLUMNS = ["sample_id", "rollout_id", "group_id", "agent", "session_id", "input_ids", "loss_mask", "token_class",
           "advantage", "call_ids", "prompt_len", "outcome_reward"]


class Samples:
    """`samples.parquet` of a compile output directory (or the file itself)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        self.path = path / "samples.parquet" if path.is_dir() else path
        if not self.path.is_file():
            raise UserError(f"--samples {path}: no samples.parquet there (run `harnessrl compile` first)")
        missing = set(COLUMNS) - set(pq.read_schema(self.path).names)
        if missing:
            raise UserError(f"{self.path} is not a compile output: no column {sorted(missing)[0]!r}")

    def _read(self, column: str, values: list[str]) -> list[dict[str, Any]]:
        table = pq.read_table(self.path, columns=COLUMNS, filters=[(column, "in", values)])
        return table.to_pylist()

    def of_rollout(self, rollout_id: str) -> list[dict[str, Any]]:
        return self._read("rollout_id", [rollout_id])

    def advantages_of(self, rollout_ids: list[str]) -> dict[str, list[float]]:
        """Per rollout, the mean advantage over the trained tokens of each of its samples (one
        number per sample: GRPO gives every trained token of a sample the same advantage)."""
        out: dict[str, list[float]] = {}
        if not rollout_ids:
            return out
        for row in self._read("rollout_id", rollout_ids):
            mask = np.asarray(row["loss_mask"], dtype=bool)
            adv = np.asarray(row["advantage"], dtype=np.float64)
            out.setdefault(row["rollout_id"], []).append(float(adv[mask].mean()) if mask.any() else 0.0)
        return out
