"""The viewer's key (issue 30): `harnessrl ui --api-key KEY` (and the proxy's key when the proxy
serves it) guards every page and JSON endpoint; a browser signs in once (the sign-in form, or a
`?key=` link that is taken off the address), holding a cookie that is not the key; scripts send the
key as a header. Start-up lines never print a database password, and `ui` on a public address
without a key warns, as `proxy` does."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import pytest
from viewer_fixtures import serve

from harnessrl.client import HarnessRL
from harnessrl.db import open_db
from harnessrl.viewer.app import create_viewer, standalone

KEY = "viewer-sekret"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("vauth") / "runs.db")
    open_db(db)[0].dispose()
    with serve(standalone(create_viewer(db, api_key=KEY))) as url:
        yield url


def test_without_the_key_pages_ask_for_it_and_json_is_refused(site):
    with httpx.Client(base_url=site) as http:
        page = http.get("/ui/rollouts/x?tab=1")
        assert page.status_code == 401 and 'type="password"' in page.text and 'action="/ui/login"' in page.text
        assert 'value="/ui/rollouts/x?tab=1"' in page.text  # back where it was asked, once signed in
        assert "script-src 'self'" in page.headers["content-security-policy"]
        api = http.get("/ui/api/rollouts")
        assert api.status_code == 401 and api.json()["error"]["type"] == "authentication_error"
        assert http.get("/ui/api/rollouts", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert http.get("/ui/static/viewer.css").status_code == 200  # no data in it


def test_scripts_send_the_key_as_a_header(site):
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
        r = httpx.get(site + "/ui/api/rollouts", headers=headers)
        assert r.status_code == 200 and r.json()["rows"] == [], r.text


def test_a_key_link_signs_in_and_is_taken_off_the_address(site):
    with httpx.Client(base_url=site) as http:
        assert http.get("/ui/?key=nope").status_code == 401
        r = http.get(f"/ui/?status=finished&key={KEY}")
        assert r.status_code == 303 and r.headers["location"] == "/ui/?status=finished"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui/" in cookie and KEY not in cookie
        assert http.get("/ui/").status_code == 200  # the cookie from now on
        assert http.get("/ui/api/rollouts").status_code == 200


def test_the_sign_in_form(site):
    with httpx.Client(base_url=site) as http:
        wrong = http.post("/ui/login", data={"key": "nope", "next": "/ui/runs"})
        assert wrong.status_code == 401 and "wrong key" in wrong.text
        assert http.get("/ui/").status_code == 401
        ok = http.post("/ui/login", data={"key": KEY, "next": "/ui/rollouts/abc"})
        assert ok.status_code == 303 and ok.headers["location"] == "/ui/rollouts/abc"
        assert http.get("/ui/").status_code == 200
    for elsewhere in ("//evil.example/ui/", "https://evil.example/", "/other", "/ui\\..\\x"):
        r = httpx.post(site + "/ui/login", data={"key": KEY, "next": elsewhere})
        assert r.status_code == 303 and r.headers["location"] == "/ui/", elsewhere


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_up(args: list[str], url: str) -> str:
    """stderr of `harnessrl ARGS` once it serves `url` (then it is stopped)."""
    proc = subprocess.Popen([sys.executable, "-m", "harnessrl", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while proc.poll() is None and time.time() < deadline:
            try:
                httpx.get(url, timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.2)
    finally:
        proc.terminate()
        err = proc.communicate(timeout=30)[1]
    return err


def test_start_up_lines_hide_the_password_and_ui_warns_on_a_public_address(pg_url):
    secret = "hunter2-not-shown"
    url = pg_url.replace("postgres@", f"postgres:{secret}@")  # the test server trusts: any password works
    port = _free_port()
    ui = _start_up(["ui", "--db", url, "--host", "0.0.0.0", "--port", str(port)], f"http://127.0.0.1:{port}/ui/")
    assert secret not in ui and "postgres:***@" in ui and "viewer on" in ui, ui
    assert "warning" in ui and "without --api-key" in ui, ui
    port = _free_port()
    proxy = _start_up(["proxy", "--db", url, "--upstream", "http://127.0.0.1:9", "--port", str(port), "--api-key",
                       "k"], f"http://127.0.0.1:{port}/health")
    assert secret not in proxy and "postgres:***@" in proxy and "recording to" in proxy, proxy
    port = _free_port()
    keyed = _start_up(["ui", "--db", url, "--host", "0.0.0.0", "--port", str(port), "--api-key", KEY],
                      f"http://127.0.0.1:{port}/ui/")
    assert "warning" not in keyed and "viewer on" in keyed, keyed


def test_an_empty_viewer_key_refuses_to_start(tmp_path):
    import os

    done = subprocess.run([sys.executable, "-m", "harnessrl", "ui", "--db", str(tmp_path / "r.db")],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "HARNESSRL_UI_API_KEY": ""})
    assert done.returncode != 0 and "key is empty" in done.stderr and "Traceback" not in done.stderr


def test_the_proxy_serves_the_viewer_behind_its_own_key(tmp_path, upstream):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "harnessrl", "proxy", "--upstream", upstream, "--db",
                             str(tmp_path / "runs.db"), "--port", str(port), "--api-key", "k"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while True:
            try:
                httpx.get(url + "/health")
                break
            except httpx.TransportError:
                assert time.time() < deadline and proc.poll() is None
                time.sleep(0.2)
        rid = HarnessRL(url, api_key="k").create_rollout(task_id="t-key").id
        assert httpx.get(url + "/ui/").status_code == 401  # the sign-in page
        assert httpx.get(url + "/ui/api/rollouts").status_code == 401
        assert httpx.get(url + "/ui/?key=wrong").status_code == 401
        with httpx.Client(base_url=url) as browser:
            assert browser.get("/ui/?key=k").status_code == 303
            page = browser.get("/ui/")
            assert page.status_code == 200 and rid in page.text
            assert browser.get("/harnessrl/rollouts").status_code == 401  # the cookie opens the viewer only
        assert httpx.get(url + "/ui/", headers={"x-api-key": "k"}).status_code == 200
        assert httpx.get(url + "/harnessrl/rollouts").status_code == 401  # the rest stays behind the key
    finally:
        proc.terminate()
        proc.wait(timeout=30)
