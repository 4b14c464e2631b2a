"""What a training run shows a person: one progress bar, with a few key figures of the last step.

transformers' own console callbacks (ProgressCallback, PrinterCallback) write every logged step's
whole metric dictionary as a line: thirty keys a step, which bury the loop's round table and the
demo's story. This bar replaces them on the main process; every step's metrics are still kept in
full (the trainer's log history, saved beside the checkpoint by trainer/run.py, and `--report-to`).
Off a terminal (a log file, CI) rich draws no live bar: the finished bar is printed once, a line a run."""

from __future__ import annotations

import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from harnessrl.console import Console

# (logged key, label, format): the loss and how hard the step pushed (gradient norm, clipped share,
# entropy); absent keys are left out (each objective logs what it has)
FIGURES = (("loss", "loss", "{:+.4f}"), ("grad_norm", "grad", "{:.3g}"), ("clip_ratio", "clip", "{:.2f}"),
           ("entropy", "entropy", "{:.2f}"), ("kl", "kl", "{:.4f}"))


def figures(logs: dict[str, float], seconds: float | None) -> str:
    """The key figures of one logged step, in a few words."""
    parts = [f"{label} {fmt.format(logs[key])}" for key, label, fmt in FIGURES
             if isinstance(logs.get(key), (int, float))]
    if seconds is not None:
        parts.append(f"{seconds:.1f} s/step")
    return "  ".join(parts)


class StepProgress(TrainerCallback):
    """A bar of optimizer steps with the last logged step's key figures, on the main process."""

    def __init__(self, label: str = "training") -> None:
        self.label = label
        self.progress: Progress | None = None
        self.started = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[figures]}"), console=Console())
        self.task = self.progress.add_task(self.label, total=state.max_steps, figures="")
        self.progress.start()
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.progress is None or not logs or "train_runtime" in logs:  # the run's closing summary is no step
            return
        per_step = (time.perf_counter() - self.started) / state.global_step if state.global_step else None
        self.progress.update(self.task, figures=figures(logs, per_step))

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def show_progress(trainer) -> None:
    """Put the bar in place of transformers' per-step metric lines."""
    for callback in (ProgressCallback, PrinterCallback):
        trainer.remove_callback(callback)
    trainer.add_callback(StepProgress())
