"""Checkpoints and weight push.

- `save_checkpoint`: a fresh directory per version (full model or LoRA adapter, tokenizer included).
- Push to the proxy: `POST /harnessrl/weights {path, version, lora}`; the proxy reloads its local
  backend (or, with several upstreams, drains and reloads each vLLM: `proxy/upstream/weight_push.py`),
  writes the weight_versions row, and later calls record the new version.
- Push to vLLM: full weights by `POST /collective_rpc {"method": "reload_weights", "kwargs":
  {"weights_path": DIR}}` (server in dev mode) then `POST /reset_prefix_cache`; LoRA by
  `POST /v1/load_lora_adapter {"lora_name": VERSION, "lora_path": DIR}` (runtime LoRA updating on).
  The version is recorded in the records DB when one is given."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import httpx

from harnessrl.checkpoints import VERSION_FILE
from harnessrl.errors import UserError


def new_version(algo: str) -> str:
    return f"{algo}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def save_checkpoint(trainer, out_dir: str | Path, version: str) -> Path:
    path = Path(out_dir) / version
    if path.exists():
        raise UserError(f"checkpoint directory already exists: {path} (choose another --version)")
    trainer.save_model(str(path))  # PEFT models save their adapter only; every rank takes part
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(str(path))
        (path / VERSION_FILE).write_text(version + "\n")  # a proxy started on it serves this version
    return path


def _post(client: httpx.Client, url: str, payload: dict | None = None) -> httpx.Response:
    try:
        r = client.post(url, json=payload)
    except httpx.HTTPError as exc:
        raise UserError(f"push failed: cannot reach {url} ({type(exc).__name__})") from None
    if r.status_code >= 400:
        try:
            msg = r.json().get("error", {}).get("message") or r.text
        except ValueError:
            msg = r.text
        raise UserError(f"push failed: {url} answered {r.status_code}: {str(msg)[:200]}")
    return r


def is_proxy(url: str, timeout: float = 10.0) -> bool:
    from harnessrl.client import default_key

    key = default_key(url)  # the proxy's operator key (its rollout list is the operator's)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        return httpx.get(f"{url.rstrip('/')}/harnessrl/rollouts", headers=headers, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        raise UserError(f"push failed: cannot reach {url}") from None


def push_proxy(url: str, path: Path, version: str, timeout: float = 600.0, lora: bool = False) -> str:
    from harnessrl.client import HarnessRL, HarnessRLError

    try:
        with HarnessRL(url, timeout=timeout) as hrl:
            return hrl.push_weights(str(path.resolve()), version=version, lora=lora)
    except (HarnessRLError, httpx.HTTPError) as exc:
        raise UserError(f"push to the proxy at {url} failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def push_vllm(url: str, path: Path, version: str, lora: bool, db: str | None = None, timeout: float = 600.0) -> str:
    from harnessrl.trainer.vllm import tied

    base = url.rstrip("/")
    if not lora and tied(path):
        print(f"warning: {path} ties its output layer to its embeddings; vLLM 0.32's reload leaves that layer at "
              "its old weights (docs/vllm.md): untie the model before training (harnessrl.trainer.vllm.untie_embeddings)",
              file=sys.stderr)
    with httpx.Client(timeout=timeout) as client:
        if lora:
            _post(client, f"{base}/v1/load_lora_adapter", {"lora_name": version, "lora_path": str(path.resolve())})
        else:
            _post(client, f"{base}/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path.resolve())}})
            _post(client, f"{base}/reset_prefix_cache")
    if db:
        record_version(db, version, path, {"target": "vllm", "url": base, "lora": lora})
    return version


def record_version(db: str, version: str, path: Path, meta: dict) -> None:
    from harnessrl.db import open_db
    from harnessrl.records import WeightVersion

    _, Session = open_db(db)
    with Session.begin() as s:
        s.add(WeightVersion(version=version, path=str(path.resolve()), meta=meta, created_at=time.time()))


def push(url: str, path: Path, version: str, target: str = "auto", lora: bool = False, db: str | None = None) -> str:
    if target == "auto":
        target = "proxy" if is_proxy(url) else "vllm"
    if target == "proxy":
        return push_proxy(url, path, version, lora=lora)
    if target == "vllm":
        return push_vllm(url, path, version, lora, db)
    raise UserError(f"unknown push target {target!r} (auto, proxy or vllm)")
