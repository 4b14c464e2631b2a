"""Compiled samples on disk, as the loop reads them: whether a run holds a token to train, the
weight versions a compiled group's trained tokens were sampled by (`loop --async` measures its
staleness from the oldest), and a step's samples put together from the groups it trains."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from harnessrl.samples import trained_versions


def trainable(samples_dir: Path) -> bool:
    """Whether any sample has a trained token (loss mask 1 past its prompt), as the trainer requires
    (trainer/data.py): a run of equal rewards everywhere, or of no sample at all, has none."""
    path = samples_dir / "samples.parquet"
    if not path.is_file():
        return False
    rows = pq.read_table(path, columns=["loss_mask", "prompt_len"]).to_pylist()
    return any(any(r["loss_mask"][r["prompt_len"]:]) for r in rows)


def trained_versions_of(samples_dir: Path) -> set[str]:
    """Every weight version that sampled a trained token of the group compiled into `samples_dir`."""
    versions: set[str] = set()
    for row in pq.read_table(samples_dir / "samples.parquet").to_pylist():
        versions |= trained_versions(row)
    return versions


def merge_samples(dirs: list[Path], out: Path) -> int:
    """The groups' samples.parquet (and tasks.parquet, each task once) as one samples directory;
    returns the number of samples."""
    out.mkdir(parents=True, exist_ok=True)
    samples = pa.concat_tables([pq.read_table(d / "samples.parquet") for d in dirs])
    pq.write_table(samples, out / "samples.parquet")
    tasks = [pq.read_table(d / "tasks.parquet") for d in dirs if (d / "tasks.parquet").is_file()]
    if tasks:
        table = pa.concat_tables(tasks)
        seen: set[str] = set()
        keep = [i for i, t in enumerate(table.column("task_id").to_pylist()) if not (t in seen or seen.add(t))]
        pq.write_table(table.take(keep), out / "tasks.parquet")
    return samples.num_rows
