"""The `loop` output directory for `/ui/runs`: the round table (`loop_state.json`) and the reward /
success / tool-validity curves, drawn as inline SVG (no image files, no scripts)."""

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


def runs_view(loop_dir: Path) -> dict[str, Any]:
    """Rounds as recorded, and one polyline per curve on a shared 0..1 axis (rewards of
    other ranges are scaled by the largest absolute value seen)."""
    state = json.loads((loop_dir / "loop_state.json").read_text())
    rounds = state.get("rounds") or []
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
            "rounds": rounds, "curves": curves, "width": WIDTH, "height": HEIGHT, "pad": PAD, "top": top}
