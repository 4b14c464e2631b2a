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
        r = _harnessrl("compile", db, "--out", str(out), "--tokenizer", str(tiny_model_dir))
        assert r.returncode == 0, r.stderr[-2000:]
        r = _harnessrl("train", str(out), "--model", str(tiny_model_dir), "--algo", "grpo", "--steps", "2",
                       "--batch-size", "4", "--lr", "1e-5", "--out", str(tmp_path / "ck"), "--version", "round-1", "--push", proxy.url)
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
