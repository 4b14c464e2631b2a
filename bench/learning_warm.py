"""bench/learning.py's base model and SFT warm starts: built once per settings and reused, in a
run's --out or in a --warm-cache shared by concurrent runs (bench/fair.py), under a file lock."""

from __future__ import annotations

import argparse
import json
import shutil
from contextlib import contextmanager
from pathlib import Path


def base_model(args: argparse.Namespace) -> str:
    """--model, or the tiny model of --hidden × --layers, reused from an earlier run in the same
    --out (or --warm-cache; the build is deterministic given them)."""
    from harnessrl.tiny_model import build_tiny_model

    if args.model:
        return args.model
    home = args.warm_cache / f"tiny-{args.hidden}x{args.layers}" if args.warm_cache else args.out
    where, key = home / "tiny", json.dumps({"hidden": args.hidden, "layers": args.layers})
    marker = home / "tiny-model.json"
    with locked(home / "build.lock"):
        if not (marker.is_file() and marker.read_text() == key and (where / "config.json").is_file()):
            marker.unlink(missing_ok=True)
            build_tiny_model(where, seed=0, hidden_size=args.hidden, layers=args.layers)
            marker.write_text(key)
    return str(where)


@contextmanager
def locked(path: Path):
    """An exclusive lock on `path` for the block: concurrent runs sharing --warm-cache build a
    model once, the others wait and reuse it."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def warm_start(where: Path, cfg, sft) -> Path:
    """The SFT warm start, reused from an earlier run in the same --out (or --warm-cache) with the
    same settings (SFT is deterministic given them)."""
    key = json.dumps({"model": cfg.model, "steps": cfg.steps, "lr": cfg.lr, "seed": cfg.seed,
                      "tasks": Path(cfg.tasks).read_text()}, sort_keys=True)
    marker = where / "warm-start.json"
    with locked(where.with_name(where.name + ".lock")):
        if marker.is_file() and marker.read_text() == key:
            return Path(marker.with_name("model").read_text())
        shutil.rmtree(where, ignore_errors=True)
        cfg.out = str(where)
        model = sft(cfg)
        marker.with_name("model").write_text(str(model))
        marker.write_text(key)
    return Path(model)
