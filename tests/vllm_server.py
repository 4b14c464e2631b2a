"""The real-vLLM tier's fixtures (`-m vllm`): the tiny model in a shape vLLM's CPU attention serves,
and `vllm serve` started by `harnessrl vllm` from `.venv-vllm` (scripts/install_vllm.sh), once per
test session and shared by every test of the tier. Without `.venv-vllm` the tier fails saying so:
install.sh makes it on every machine (the CPU build where there is no GPU)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
VLLM_BIN = ROOT / ".venv-vllm" / "bin" / "vllm"
SERVED = "tiny"
START_TIMEOUT_S = 600  # a cold start compiles the model (about 75 s on 2 loaded cores)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def vllm_model_dir() -> Path:
    """The tiny model in VLLM_SHAPE with its own output layer (`harnessrl tiny-model --vllm`);
    cached like conftest's tiny model, by source hash."""
    from conftest import _CACHE, _tiny_model_key
    from filelock import FileLock

    from harnessrl.tiny_model import VLLM_SHAPE, build_tiny_model
    from harnessrl.trainer.vllm import untie_embeddings

    out = _CACHE / f"tiny-vllm-{_tiny_model_key()}"
    _CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if not (out / "config.json").exists():
            tmp = out.with_name(out.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
            build_tiny_model(tmp, **VLLM_SHAPE)
            untie_embeddings(tmp)
            tmp.rename(out)
    return out


@contextlib.contextmanager
def vllm_serve(model: Path, log: Path, port: int | None = None, lora: bool = False):
    """`harnessrl vllm MODEL` (full-weight reload enabled, or runtime LoRA loading with `lora`) on a
    free port; yields its base URL.
    float32: the tiny model's weights as trained, so its log-probs can be checked against the
    trainer's (vLLM's CPU default would downcast to bfloat16)."""
    if not VLLM_BIN.is_file():
        pytest.fail(f"{VLLM_BIN} is missing: run scripts/install_vllm.sh (scripts/install.sh runs it)")
    port = port or free_port()
    cmd = [str(Path(sys.executable).with_name("harnessrl")), "vllm", str(model), "--port", str(port),
           "--vllm-bin", str(VLLM_BIN), "--served-model-name", SERVED, "--dtype", "float32", "--seed", "0"] + (["--lora"] if lora else [])
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited ({proc.returncode}) while starting; its log {log} ends:\n"
                            + log.read_text(errors="replace")[-3000:])
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not answer /health within {START_TIMEOUT_S} s (log {log})")
            time.sleep(1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="session")
def vllm_url(vllm_model_dir, tmp_path_factory):
    """The tier's one vLLM server. Tests that push weights push `vllm_model_dir` back after."""
    t0 = time.monotonic()
    with vllm_serve(vllm_model_dir, tmp_path_factory.mktemp("vllm") / "vllm.log") as url:
        print(f"\nvllm serve up in {time.monotonic() - t0:.1f} s")
        yield url
