"""A checkpoint that cannot be written (found running the real model: a loop's checkpoints filled
the disk, and `harnessrl loop` died in a traceback ending "unexpected pos 64960 vs 64852") is one
line naming the checkpoint and the free space, a non-zero exit, and no half-written checkpoint
left to resume or push from. The disk is made full for the trainer alone: its process may write
no file larger than 256 KiB (RLIMIT_FSIZE), so the weights' write fails as on a full disk."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys

from trainer_fixtures import tiny_samples

LIMIT = 256 * 1024  # bytes: the tiny model's weights are several MiB


def _small_files_only() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process


def test_a_checkpoint_that_cannot_be_written_is_one_line_and_leaves_nothing(tmp_path, tiny_model_dir):
    samples = tiny_samples(tmp_path / "s", tiny_model_dir)
    out = tmp_path / "ck"
    res = subprocess.run([sys.executable, "-m", "harnessrl", "train", str(samples), "--model", str(tiny_model_dir),
                          "--out", str(out), "--steps", "1", "--batch-size", "4", "--weight-version", "v1"],
                         capture_output=True, text=True, preexec_fn=_small_files_only, timeout=600)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr + res.stdout
    lines = [ln for ln in res.stderr.splitlines() if "could not write the checkpoint" in ln]
    assert len(lines) == 1 and str(out / "v1") in lines[0] and "MiB free on its disk" in lines[0], res.stderr[-2000:]
    assert not (out / "v1").exists()  # removed, not left half-written
