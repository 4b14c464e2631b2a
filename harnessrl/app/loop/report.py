"""What a loop prints and draws: the round table, the asynchronous loop's step table and totals,
and `<out>/curves.png`."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from harnessrl.app.loop.state import LoopState


# the training–inference mismatch the trainer logs every step (docs/methods.md §6.5), shown beside each
# round or step so that a drifting engine is seen without opening the trainer's log
MISMATCH_COLUMNS = ("mismatch KL", "out of band")


def mismatch_cells(row: dict) -> tuple[str, str]:
    """A row's mean mismatch KL (k3) and share of tokens outside the band over its steps; blank where
    the trainer logged none (no recorded sampling log-prob, or a loop from before the metric)."""
    log = row.get("train_log") or {}
    kl, out = log.get("mismatch/kl"), log.get("mismatch/out_of_band_frac")
    return ("" if kl is None else f"{kl:.2e}", "" if out is None else f"{out:.3f}")


def round_table(state: LoopState) -> Table:
    table = Table(title="harnessrl loop")
    for col in ("round", "reward", "success", "tool-call validity", "eval success", "tokens", "samples", "failed",
                *MISMATCH_COLUMNS, "time (s)", "weights"):
        table.add_column(col, justify="right")
    if state.initial_eval is not None:
        table.add_row("start", "", "", "", f"{state.initial_eval:.3f}", "", "", "", "", "", "", "base")
    for row in state.rounds:
        table.add_row(str(row["round"]), f"{row['train_reward']:.3f}", f"{row['train_success']:.3f}",
                      f"{row['tool_validity']:.3f}", f"{row['eval_success']:.3f}", str(row["tokens"]),
                      str(row["samples"]), str(row.get("failed", 0)), *mismatch_cells(row), f"{row['seconds']:.1f}",
                      row["version"])
    return table


def step_table(state: LoopState) -> Table:
    """`loop --async`: a row per optimizer step, its evaluations, and the totals as the caption."""
    evals = {e["step"]: e for e in state.evals}
    table = Table(title="harnessrl loop --async")
    for col in ("step", "groups", "staleness (mean/max)", "reward", "success", "samples", "eval success",
                *MISMATCH_COLUMNS, "time (s)", "weights"):
        table.add_column(col, justify="right")
    if state.initial_eval is not None:
        table.add_row("start", "", "", "", "", "", f"{state.initial_eval:.3f}", "", "", "", "base")
    for row in state.steps:
        st = row["staleness"] or [0]
        held = evals.get(row["step"])
        table.add_row(str(row["step"]), str(len(row["groups"])), f"{sum(st) / len(st):.2f}/{max(st)}",
                      f"{row['reward']:.3f}", f"{row['success']:.3f}", str(row["samples"]),
                      f"{held['success']:.3f}" if held else "", *mismatch_cells(row), f"{row['seconds']:.1f}",
                      row["version"] or "")
    t = state.totals
    if t:
        table.caption = (f"{t.get('steps', 0):.0f} steps, {t.get('versions', 0):.0f} versions pushed; staleness mean "
                         f"{t.get('mean_staleness', 0):.2f}, max {t.get('max_staleness', 0):.0f}; "
                         f"{t.get('dropped_stale', 0):.0f} groups dropped as stale; idle: producer "
                         f"{t.get('producer_idle_s', 0):.1f} s, trainer {t.get('trainer_idle_s', 0):.1f} s of "
                         f"{t.get('wall_s', 0):.1f} s")
    return table


def plot_curves(state: LoopState, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if state.mode == "async":
        steps = [row["step"] for row in state.steps]
        ax.plot(steps, [row["reward"] for row in state.steps], marker="o", label="train reward")
        ax.plot(steps, [row["success"] for row in state.steps], marker="s", label="train success")
        ax.plot([e["step"] for e in state.evals], [e["success"] for e in state.evals], marker="^",
                label="held-out success")
        ax.set_xlabel("optimizer step")
    else:
        rounds = [row["round"] for row in state.rounds]
        ax.plot(rounds, [row["train_reward"] for row in state.rounds], marker="o", label="train reward")
        ax.plot(rounds, [row["train_success"] for row in state.rounds], marker="s", label="train success")
        ax.plot(rounds, [row["eval_success"] for row in state.rounds], marker="^", label="held-out success")
        ax.set_xlabel("round")
    if state.initial_eval is not None:
        ax.axhline(state.initial_eval, color="grey", linestyle=":", label="held-out success at start")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
