"""`POST /harnessrl/weights`: load new weights where the proxy's calls are served — every
upstream of several, drained and reloaded in turn (`upstream.weight_push`), the local backend, or
an upstream through the library caller's reload hook — and record the new weight version."""

from __future__ import annotations

import os

import orjson
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from harnessrl.proxy.config import ProxyConfig
from harnessrl.proxy.errors import ProxyError, bad_request
from harnessrl.proxy.identity import check_labels, key_required
from harnessrl.proxy.lifespan import Lifespan
from harnessrl.proxy.rollouts.store import Rollouts
from harnessrl.proxy.routes.token_backend import TokenBackend
from harnessrl.proxy.upstream.weight_push import push_all


class WeightsIn(BaseModel):
    path: str
    version: str | None = None
    lora: bool = False  # several upstreams: load the checkpoint as a LoRA adapter named `version`


def add_weights_api(app: FastAPI, cfg: ProxyConfig, backend: TokenBackend | None, store: Rollouts,
                    running: Lifespan) -> None:

    @app.post("/harnessrl/weights", dependencies=[key_required(cfg.api_key)])
    async def push_weights(body: WeightsIn):
        check_labels(version=body.version)
        if "\0" in body.path:
            raise bad_request("'path' may not hold U+0000", param="path", code="invalid_value")
        if running.upstreams is not None:
            version = body.version or os.path.basename(body.path.rstrip("/"))
            check_labels(version=version)
            report = await push_all(running.upstreams, body.path, version, body.lora, cfg.push_mode,
                                    cfg.drain_timeout_s)
            await run_in_threadpool(store.weight_version, version, body.path)
            return Response(orjson.dumps(report), 200, media_type="application/json")
        return await run_in_threadpool(_push_one_backend, body)

    def _push_one_backend(body: WeightsIn) -> Response:
        if backend is not None:
            try:
                version = backend.reload(body.path, body.version)
            except Exception as exc:  # noqa: BLE001 - a bad checkpoint is the caller's error
                raise ProxyError(400, f"cannot load weights from {body.path!r}: {exc}", param="path",
                                 code="bad_checkpoint") from None
        elif cfg.reload_hook is not None:
            version = cfg.reload_hook(body.path, body.version)
        else:
            raise ProxyError(400, "this proxy forwards to an upstream without a reload hook: push weights to the "
                                  "inference server itself", code="reload_unsupported")
        store.weight_version(version, body.path)
        return Response(orjson.dumps({"version": version}), 200, media_type="application/json")
