"""One interception session for tests/test_intercept.py, run inside a network namespace with only
loopback up: `harnessrl run` (with its own proxy on the tiny model) around tests/intercept_clients,
then `harnessrl intercept --only-llm` refusing what is not an LLM call. Writes OUT/results.json.

    python intercept_session.py OUT MODEL
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HARNESSRL = [sys.executable, "-m", "harnessrl"]
CLIENTS = Path(__file__).with_name("intercept_clients")
KEYS = {"TEST_OPENAI_KEY": "sk-proj-Zq8hT3BlbkFJ7xkLmQp2RvN9wEaYc4uD6sG1fH0jK",
        "TEST_ANTHROPIC_KEY": "sk-ant-api03-Wm4nB7vC2xZ9qL5kJ8hG3fD6sA1pO0iU",
        "TEST_CURL_KEY": "sk-curl-Ty6rE4wQ9oP2iU7yT5rE3wQ1aS8dF0gH",
        "TEST_NODE_KEY": "sk-node-Kj3hG6fD9sA2lK5jH8gF1dS4aQ7wE0rT"}


class PlainServer(BaseHTTPRequestHandler):
    """A web server that is not an LLM API: remembers what reached it."""
    seen: list[dict] = []

    def do_GET(self) -> None:
        PlainServer.seen.append({"path": self.path, "authorization": self.headers.get("authorization")})
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _curl_status(*args: str) -> str:
    return subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", *args],
                          capture_output=True, text=True).stdout


def main(out: Path, model: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), PlainServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    plain = f"http://127.0.0.1:{server.server_address[1]}/plain"
    (out / "db").mkdir()
    (out / "hosts.yaml").write_text("- '*.llm.internal'\n")
    env = {**os.environ, **KEYS, "HARNESSRL_HOME": str(out / "home"), "PLAIN_URL": plain,
           "RESULTS": str(out / "clients.txt"), "PYTHON": sys.executable, "COLUMNS": "200"}
    run = subprocess.run(HARNESSRL + ["run", "--model", model, "--db", str(out / "db" / "runs.db"), "--run", "ns",
                                      "--task", "t1", "--hosts", str(out / "hosts.yaml"), "--reward-from",
                                      "stdout-json", "--", "bash", str(CLIENTS / "clients.sh")],
                         capture_output=True, text=True, env=env, timeout=240)
    clients = dict(line.split("=", 1) for line in (out / "clients.txt").read_text().split("\n") if "=" in line)

    port = _free_port()
    icpt = subprocess.Popen(HARNESSRL + ["intercept", "--only-llm", "--proxy", "http://127.0.0.1:9", "--port",
                                         str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    proxy = ["--proxy", f"http://127.0.0.1:{port}", "--noproxy", ""]
    refused = {"http": _curl_status(*proxy, plain),
               # CONNECT to a host that is not an LLM API is refused before any TLS
               "connect": subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_connect}", *proxy,
                                          "https://example.com/"], capture_output=True, text=True).stdout}
    icpt.terminate()
    banner = icpt.communicate(timeout=30)[0]
    (out / "results.json").write_text(json.dumps({
        "run_rc": run.returncode, "run_stdout": run.stdout, "run_stderr": run.stderr, "clients": clients,
        "plain_seen": PlainServer.seen, "refused": refused, "intercept_banner": banner, "keys": KEYS}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
