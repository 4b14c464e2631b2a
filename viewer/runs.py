"""The `loop` output directory for `/ui/runs`: the round table (`loop_state.json`) and the reward /
success / tool-validity curves, drawn as inline SVG (no image files, no scripts); for `loop --async`
its step table. Each row shows the training–inference mismatch the trainer logged (docs/methods.md §6.5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harnessrl.errors import UserError

CURVES = (("train_reward", "train reward"), ("train_success", "train success"),
          ("tool_validity", "tool validity"), ("eval_success", "held-out success"))
WIDTH, HEIGHT, PAD = 560, 220, 30


def check_loop_dir(path: str | Path) -> Path:
    path = Path(path)
    if not (path / "loop_state.json").is_file():
        raise UserError(f"--loop {path}: no loop_state.json there (a `harnessrl loop --out` directory)")
    return path


def mismatch(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its mismatch cells: the mean k3 KL(π_behaviour ‖ π_old) over its steps, as text
    (it is often below 1e-3, where a 3-decimal cell reads 0), and the share of tokens outside the
    band; None where the trainer logged none (as the loop's printed table, app/loop/report.py)."""
    log = row.get("train_log") or {}
    kl = log.get("mismatch/kl")
    return {**row, "mismatch_kl": None if kl is None else f"{kl:.2e}", "out_of_band": log.get("mismatch/out_of_band_frac")}


def step_row(row: dict[str, Any]) -> dict[str, Any]:
    """An async loop's optimizer step as the page shows it (staleness as mean/max over its groups)."""
    stale = row.get("staleness") or [0]
    return mismatch({**row, "stale": f"{sum(stale) / len(stale):.2f}/{max(stale)}"})


def runs_view(loop_dir: Path) -> dict[str, Any]:
    """Rounds as recorded, and one polyline per curve on a shared 0..1 axis (rewards of
    other ranges are scaled by the largest absolute value seen)."""
    state = json.loads((loop_dir / "loop_state.json").read_text())
    rounds = [mismatch(r) for r in state.get("rounds") or []]
    top = max([1.0] + [abs(float(r.get(k) or 0.0)) for r in rounds for k, _ in CURVES])
    xs = [r["round"] for r in rounds]
    span = max(1, (max(xs) - min(xs)) if xs else 1)

    def point(x: float, y: float) -> str:
        px = PAD + (x - (min(xs) if xs else 0)) / span * (WIDTH - 2 * PAD)
        py = HEIGHT - PAD - (y / top) * (HEIGHT - 2 * PAD)
        return f"{px:.1f},{py:.1f}"

    curves = [{"key": k, "label": label,
               "points": " ".join(point(r["round"], float(r.get(k) or 0.0)) for r in rounds)} for k, label in CURVES]
    return {"dir": str(loop_dir), "model": state.get("model"), "initial_eval": state.get("initial_eval"),
            "rounds": rounds, "steps": [step_row(r) for r in state.get("steps") or []], "curves": curves,
            "width": WIDTH, "height": HEIGHT, "pad": PAD, "top": top}
