"""The end-of-compile summary table."""

from __future__ import annotations

from typing import Any

from rich.table import Table

_ROWS = (
    ("rollouts", "rollouts"), ("calls", "calls"), ("failed", "failed calls (skipped)"),
    ("retokenized", "retokenized calls"), ("sessions", "sessions"), ("samples", "samples"),
    ("merges", "merges (extends)"), ("roots_start", "roots: session start"), ("roots_branch", "roots: branch"),
    ("roots_drift", "new roots: drift"), ("roots_rewrite", "new roots: rewrite"),
    ("untrained_sessions", "sessions not trained"), ("no_outcome", "rollouts without outcome"),
    ("tokens_recorded", "tokens recorded (Σ|S_c|)"), ("tokens_emitted", "tokens emitted"),
    ("token_saving", "token saving"), ("trainable_tokens", "trainable tokens"),
    ("class_reasoning", "  reasoning"), ("class_action", "  action"), ("class_args", "  args"),
    ("class_format", "  format"), ("seconds", "seconds"),
)


def summary_table(totals: dict[str, Any]) -> Table:
    table = Table(title="compile summary")
    table.add_column("")
    table.add_column("value", justify="right")
    for key, label in _ROWS:
        v = totals.get(key, 0)
        table.add_row(label, f"{v:,.2f}" if isinstance(v, float) else f"{v:,}")
    if totals.get("seconds"):
        table.add_row("recorded tokens/s", f"{totals.get('tokens_recorded', 0) / totals['seconds']:,.0f}")
    return table
