"""Weight push: to a vLLM stand-in speaking vLLM's reload endpoints, and end to end through the
proxy's local backend (rollouts recorded → compiled → trained → pushed → next call carries the
new weight version)."""

import json
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from harnessrl.errors import UserError
from harnessrl.trainer.push import push, push_vllm


@contextmanager
def vllm_standin(fail: bool = False):
    """vLLM's dev-mode and runtime-LoRA endpoints, recording what they receive."""
    app = FastAPI()
    seen: list[tuple[str, dict | None]] = []

    @app.post("/collective_rpc")
    async def rpc(request: Request):
        body = await request.json()
        seen.append(("/collective_rpc", body))
        if fail:
            return JSONResponse({"error": {"message": "reload failed: no such dir", "type": "BadRequestError", "param": None, "code": 400}}, status_code=400)
        return {"results": [None]}

    @app.post("/reset_prefix_cache")
    async def reset():
        seen.append(("/reset_prefix_cache", None))
        return JSONResponse(None)

    @app.post("/v1/load_lora_adapter")
    async def lora(request: Request):
        body = await request.json()
        seen.append(("/v1/load_lora_adapter", body))
        return f"Success: LoRA adapter '{body['lora_name']}' added successfully."

    @app.get("/harnessrl/rollouts")
    async def not_proxy():
        return JSONResponse({"detail": "Not Found"}, status_code=404)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", seen
    finally:
        server.should_exit = True
        th.join(5)


def test_push_to_vllm_full_and_lora_records_version(tmp_path):
    ck = tmp_path / "v7"
    ck.mkdir()
    db = str(tmp_path / "runs.db")
    with vllm_standin() as (url, seen):
        assert push(url, ck, "v7", target="auto", lora=False, db=db) == "v7"  # auto: not a proxy → vLLM
        assert seen == [("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(ck.resolve())}}),
                        ("/reset_prefix_cache", None)]
        seen.clear()
        push_vllm(url, ck, "v8-lora", lora=True, db=db)
        assert seen == [("/v1/load_lora_adapter", {"lora_name": "v8-lora", "lora_path": str(ck.resolve())})]
    from harnessrl.db import open_db
    from harnessrl.records import WeightVersion

    _, Session = open_db(db)
    with Session() as s:
        rows = {w.version: w for w in s.query(WeightVersion).all()}
    assert set(rows) == {"v7", "v8-lora"} and rows["v8-lora"].meta["lora"] is True and rows["v7"].path == str(ck.resolve())


def test_push_errors_are_one_line(tmp_path):
    with vllm_standin(fail=True) as (url, _):
        with pytest.raises(UserError, match="answered 400: reload failed"):
            push_vllm(url, tmp_path, "v1", lora=False)
    with pytest.raises(UserError, match="cannot reach"):
        push("http://127.0.0.1:9", tmp_path, "v1")


def _harnessrl(*args: str) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("harnessrl"))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_record_compile_train_push_then_next_call_has_new_version(tmp_path, tiny_model_dir):
    from openai import OpenAI

    from harnessrl.client import HarnessRL
    from harnessrl.proxy.server import ProxyConfig, run_proxy

    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0)) as proxy, HarnessRL(proxy.url) as hrl:
        for task in ("t1", "t2"):
            for k in range(2):
                with hrl.rollout(task_id=task, group_id=task) as ro:
                    client = OpenAI(base_url=ro.base_url("planner"), api_key="x")
                    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"Find {task}?"}],
                                                   max_tokens=8, temperature=1.0)
                    ro.reward(float(k))  # one success and one failure per group
        out = tmp_path / "compiled"
        r = _harnessrl("compile", "--db", db, "--out", str(out), "--tokenizer", str(tiny_model_dir))
        assert r.returncode == 0, r.stderr[-2000:]
        r = _harnessrl("train", str(out), "--model", str(tiny_model_dir), "--algo", "grpo", "--steps", "2",
                       "--batch-size", "4", "--lr", "1e-5", "--out", str(tmp_path / "ck"), "--weight-version", "round-1", "--push", proxy.url)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "pushed" in r.stdout
        with hrl.rollout(task_id="t1", group_id="t1-next") as ro:
            raw = OpenAI(base_url=ro.base_url("planner"), api_key="x").chat.completions.with_raw_response.create(
                model="tiny", messages=[{"role": "user", "content": "Find t1?"}], max_tokens=4)
            call_id = raw.headers["x-harnessrl-call"]
            calls = hrl.get_rollout(ro.id)["calls"]
        assert [c["weight_version"] for c in calls if c["id"] == call_id] == ["round-1"]
    stats = json.loads((out / "stats.json").read_text())
    assert stats  # the compile step reported its statistics

    # The other objectives on the same proxy-recorded rollouts: ≥ 2 optimizer steps each.
    from trainer_fixtures import make_trainer, tiny_samples
    from transformers import AutoModelForCausalLM

    from harnessrl.trainer.capo import CapoTrainer
    from harnessrl.trainer.capo_partition import build_partition, write_outputs
    from harnessrl.trainer.data import load_samples
    from harnessrl.trainer.matpo import MatpoTrainer

    # The tiny model's random replies make no tool calls, so the partition is probed on fixture samples.
    probe = tiny_samples(tmp_path / "probe", tiny_model_dir)
    part, report = build_partition(AutoModelForCausalLM.from_pretrained(tiny_model_dir), load_samples(probe).samples)
    write_outputs(part, report, tmp_path / "partition.pt")
    capo = make_trainer(CapoTrainer, tiny_model_dir, out, algo="capo", partition=str(tmp_path / "partition.pt"), batch_size=4)
    capo.train()
    assert capo.state.global_step == 2
    r = _harnessrl("compile", "--db", db, "--out", str(tmp_path / "matpo"), "--tokenizer", str(tiny_model_dir), "--advantage", "matpo")
    assert r.returncode == 0, r.stderr[-2000:]
    matpo = make_trainer(MatpoTrainer, tiny_model_dir, tmp_path / "matpo", algo="matpo", batch_size=4)
    matpo.train()
    assert matpo.state.global_step == 2


def test_vllm_launcher_flags_and_missing_binary(tmp_path, monkeypatch):
    from harnessrl.trainer.vllm import find_vllm, serve_command

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cmd, env = serve_command("/opt/v/bin/vllm", "/models/m", port=8101, extra=["--max-model-len", "4096"])
    joined = " ".join(cmd)
    assert cmd[:3] == ["/opt/v/bin/vllm", "serve", "/models/m"]
    assert "--tool-call-parser hermes" in joined and "--logprobs-mode processed_logprobs" in joined
    assert joined.endswith("--max-model-len 4096")
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}  # the CPU build's KV cache, GiB
    cmd, env = serve_command("/opt/v/bin/vllm", "/models/m", lora=True, max_lora_rank=32)
    assert "--enable-lora" in cmd and cmd[cmd.index("--max-lora-rank") + 1] == "32"
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_CPU_KVCACHE_SPACE": "1"}
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("HARNESSRL_VLLM_BIN", raising=False)
    monkeypatch.setattr("harnessrl.trainer.vllm.DEFAULT_BINS", ())
    with pytest.raises(UserError, match="no vLLM found"):
        find_vllm(str(tmp_path / "missing"))
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert find_vllm(str(fake)) == str(fake)
