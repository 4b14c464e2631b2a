"""`harnessrl proxy` serves the trace viewer live at /ui/ (wired by the app layer), not with
`--no-ui`; with `--api-key` it asks for that key (the sign-in: tests/test_viewer_auth.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import pytest
from openai import OpenAI

from harnessrl.client import HarnessRL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path, tiny_model_dir, *flags):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "harnessrl", "proxy", "--backend", "local", "--model",
                             str(tiny_model_dir), "--db", str(tmp_path / "runs.db"), "--port", str(port), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()
        try:
            httpx.get(url + "/v1/models", headers={"Authorization": "Bearer k"})
            return proc, url
        except httpx.TransportError:
            assert time.time() < deadline, "the proxy did not start"
            time.sleep(0.2)


@pytest.mark.parametrize("flags, served", [((), True), (("--no-ui",), False), (("--api-key", "k"), False)])
def test_viewer_mounted_in_the_proxy(tmp_path, tiny_model_dir, flags, served):
    proc, url = _start(tmp_path, tiny_model_dir, *flags)
    try:
        hrl = HarnessRL(url, api_key="k")
        rid = hrl.create_rollout(task_id="t-ui").id
        client = OpenAI(base_url=f"{url}/r/{rid}/a/solver/v1", api_key="k")
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi <b>there</b>"}],
                                       max_tokens=3)
        page = httpx.get(url + "/ui/")
        if not served:  # --no-ui: none; --api-key: the sign-in page
            assert page.status_code == (401 if "--api-key" in flags else 404)
            return
        assert page.status_code == 200 and rid in page.text  # recorded after the proxy started: live
        assert "script-src 'self'" in page.headers["content-security-policy"]
        rollout = httpx.get(url + f"/ui/rollouts/{rid}")
        assert rollout.status_code == 200 and "hi &lt;b&gt;there&lt;/b&gt;" in rollout.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
