"""Headless Chromium driven over the Chrome DevTools protocol (the `websockets` client): for what
a DOM dump cannot show — the page's script reacting to clicks, hovers and time (live refresh)."""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import connect


class Page:
    def __init__(self, ws: Any):
        self.ws = ws
        self._id = 0

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:  # events arrive in between; the reply carries our id
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def eval(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && document.documentElement.dataset.js === 'on'")

    def click(self, element: str) -> None:
        """A real mouse click (pressed and released) at the middle of `element` (a JS expression),
        scrolled into view first: what a user's click does, default actions included."""
        box = self.eval(f"(e => {{ e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); "
                        f"return [r.left + Math.min(r.width / 2, 40), r.top + r.height / 2]; }})({element})")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))

    def wait_for(self, expression: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.eval(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout} s: {expression}")
            time.sleep(0.1)


@contextmanager
def chromium_page(binary: str, profile: Path):
    """A headless Chromium with one page; the DevTools port is read from the profile directory."""
    profile.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-extensions", "--disable-background-networking", "--remote-debugging-port=0",
                             f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            target = next(t for t in json.load(resp) if t["type"] == "page")
        with connect(target["webSocketDebuggerUrl"], max_size=None) as ws:
            yield Page(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
