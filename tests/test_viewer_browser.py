"""The trace viewer in a real browser: headless Chromium (Debian's `chromium` package) loads the
pages from a real server, runs their script under the Content-Security-Policy, and its DOM after
a virtual-time budget (`--dump-dom`) is what these tests read; `--screenshot` saves the pictures.

Screenshots go to $HARNESSRL_SCREENSHOTS when set, else to `screenshots/` in pytest's base temp
directory (the path is printed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import openai
import pytest
from cdp import chromium_page
from viewer_fixtures import (HARNESS, ONERROR, PAYLOAD, RATE_LIMITED, SCRIPT, compile_samples, insert_long_session,
                             record_all, serve)

from harnessrl.client import HarnessRL
from harnessrl.proxy.local.backend import LocalBackend
from harnessrl.proxy.server import ProxyConfig, run_proxy
from harnessrl.viewer.app import create_viewer, standalone

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian: apt-get install chromium)")


class Dom(HTMLParser):
    """The elements of a serialised DOM: (tag, attributes) in document order, and all text."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.texts: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data):
        self.texts.append(data)

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def having(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        """Elements of `tag` with these attribute values (`class_`: one of its classes)."""
        def matches(a: dict[str, str]) -> bool:
            return all(v in a.get("class", "").split() if k == "class_" else a.get(k) == v for k, v in attrs.items())

        return [a for t, a in self.elements if t == tag and matches(a)]


def chromium(url: str, tmp: Path, screenshot: Path | None = None, height: int = 1000) -> Dom | None:
    """Load `url` headless; the DOM after 3 s of virtual time, or a screenshot."""
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
            "--disable-background-networking", "--disable-component-update", f"--user-data-dir={tmp / 'profile'}",
            "--virtual-time-budget=3000", f"--window-size=1400,{height}"]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    done = subprocess.run(args + [url], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    if screenshot:
        assert screenshot.stat().st_size > 10_000  # a rendered page, not a blank one
        return None
    return Dom(done.stdout)


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    out = Path(os.environ.get("HARNESSRL_SCREENSHOTS") or tmp_path_factory.getbasetemp() / "screenshots")
    out.mkdir(parents=True, exist_ok=True)
    print(f"viewer screenshots: {out}")
    return out


@pytest.fixture(scope="module")
def site(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    db = str(tmp / "runs.db")
    ids = record_all(db, tiny_model_dir)
    viewer = create_viewer(db, samples=compile_samples(db, tmp / "compiled"))
    with serve(standalone(viewer)) as url:
        yield url + "/ui", ids, tmp
    viewer.state.engine.dispose()


def test_list_page_shows_the_rollouts_and_filters(site, shots):
    url, ids, tmp = site
    dom = chromium(url + "/", tmp)
    shown = [a["data-rollout"] for a in dom.having("tr") if "data-rollout" in a]
    assert set(shown) == {ids["planner"], ids["retry"], ids["running"], "crafted"}
    assert dom.having("html", **{"data-js": "on"})  # the viewer's own script ran under the CSP
    # the new columns: the running rollout's refused call counts as an error; the harness's
    # User-Agent (with markup) is text
    assert [a["class"] for a in dom.having("td", class_="errors")].count("num errors has-errors") == 1
    assert HARNESS in dom.text and not dom.having("b") and dom.having("span", class_="kind", title=HARNESS)
    dom = chromium(url + "/?run=round-0&sort=reward&order=asc", tmp)
    assert [a["data-rollout"] for a in dom.having("tr") if "data-rollout" in a] == [ids["retry"], ids["planner"]]
    chromium(url + "/", tmp, shots / "viewer-rollouts.png", height=520)


def test_rollout_page_shows_calls_tree_classes_rewards_advantages(site, shots):
    url, ids, tmp = site
    dom = chromium(f"{url}/rollouts/{ids['planner']}", tmp)
    for name in ("p0", "w0", "p1"):
        assert dom.having("details", id=f"call-{ids[name]}"), name
    assert len(dom.having("section", class_="tree")) == 2  # the planner's tree and the worker's session
    assert dom.having("span", class_="merge")  # p1 extends p0
    assert "dispatched by" in dom.text and "<i>fmt</i> = 0.500" in dom.text  # the edge; a process reward
    dom = chromium(f"{url}/rollouts/crafted", tmp)
    for cls in ("c-reasoning", "c-action", "c-args", "c-format"):
        assert dom.having("span", class_=cls), cls
    assert dom.having("span", class_="special")  # <|im_end|> boxed
    assert dom.having("div", class_="sample") and (dom.having("span", class_="adv-p2")
                                                    or dom.having("span", class_="adv-p3"))
    assert "1.000" in dom.text  # the outcome reward
    chromium(f"{url}/rollouts/crafted", tmp, shots / "viewer-rollout.png", height=900)


def test_recorded_markup_is_text_and_runs_nothing(site, shots):
    url, ids, tmp = site
    dom = chromium(f"{url}/rollouts/{ids['retry']}", tmp)
    scripts = dom.having("script")
    assert [s["src"] for s in scripts] == ["/ui/static/viewer.js"]  # no script element from content
    assert not dom.having("img") and not [a for _, a in dom.elements if any(k.startswith("on") for k in a)]
    assert not [a for t, a in dom.elements if t == "a" and "example.com" in a.get("href", "")]
    assert dom.having("html", **{"data-js": "on"}) and not dom.having("body", **{"data-pwned": "1"})
    title = next(t for t in dom.texts if "harnessrl viewer" in t)
    assert "pwned" not in title  # the payload's script never ran
    assert PAYLOAD in dom.text and SCRIPT in dom.text and ONERROR in dom.text  # shown as text, verbatim
    chromium(f"{url}/rollouts/{ids['retry']}", tmp, shots / "viewer-escaped.png", height=900)


def _record(url: str, content: str) -> str:
    with HarnessRL(url) as hrl, hrl.rollout(task_id="live", run="live") as ro:
        client = openai.OpenAI(base_url=ro.base_url("solo"), api_key="unused", max_retries=0)
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}],
                                       max_tokens=4, temperature=0)
    return ro.id


def test_the_viewer_in_the_recording_proxy_shows_new_calls(tiny_model_dir, tmp_path):
    """Mounted at /ui in the running proxy (as the app layer mounts it): a rollout recorded after
    the page was loaded appears when the page is loaded again, and with "live" on it appears
    without a reload; the page's controls work (collapse / expand, token details on hover)."""
    db = str(tmp_path / "runs.db")
    backend = LocalBackend(tiny_model_dir, seed=0)
    try:
        with run_proxy(ProxyConfig(db=db, backend="local", model=str(tiny_model_dir), port=0), backend=backend) as proxy:
            viewer = create_viewer(db, tokenizer=str(tiny_model_dir))  # the proxy knows its model directory
            proxy.app.api.mount("/ui", viewer)
            before = chromium(proxy.url + "/ui/", tmp_path)
            assert not [a for a in before.having("tr") if "data-rollout" in a]
            first = _record(proxy.url, "hi <b>x</b>")
            after = chromium(proxy.url + "/ui/", tmp_path)
            assert [a["data-rollout"] for a in after.having("tr") if "data-rollout" in a] == [first]
            page = chromium(f"{proxy.url}/ui/rollouts/{first}", tmp_path)
            assert len(page.having("details", class_="node")) == 1 and "hi <b>x</b>" in page.text

            rows = "[...document.querySelectorAll('tr[data-rollout]')].map(r => r.dataset.rollout)"
            with chromium_page(CHROMIUM, tmp_path / "cdp") as tab:
                tab.goto(proxy.url + "/ui/")
                tab.eval("window.loadedOnce = true; document.getElementById('live').click()")
                second = _record(proxy.url, "a second one")
                tab.wait_for(f"{rows}.includes('{second}')")  # refreshed in place within a few seconds
                assert tab.eval("window.loadedOnce === true")  # the same document: no reload
                assert tab.eval(rows) == [second, first]

                tab.goto(f"{proxy.url}/ui/rollouts/{second}")
                details = "[...document.querySelectorAll('details')]"
                tab.eval("document.querySelector('button[data-expand=close]').click()")
                assert tab.eval(f"{details}.every(d => !d.open)")
                tab.eval("document.querySelector('button[data-expand=open]').click()")
                assert tab.eval(f"{details}.every(d => d.open)")
                tab.eval("document.querySelector('.completion .tok').dispatchEvent("
                         "new MouseEvent('mouseover', {bubbles: true}))")
                info = tab.eval("document.getElementById('tokinfo').hidden ? '' : "
                                "document.getElementById('tokinfo').textContent")
                assert "log-prob" in info and " · p " in info
            viewer.state.engine.dispose()
    finally:
        backend.close()


def test_the_viewer_behind_a_key_signs_a_browser_in_once(upstream, tmp_path):
    """With a key (the proxy's, as `harnessrl proxy --api-key` serves it), a browser gets the
    sign-in page, types the key once and is in: the pages, the live refresh (its script's
    requests carry the cookie) and a rollout page work; a `?key=` link signs a fresh browser in
    and leaves no key in the address."""
    db = str(tmp_path / "runs.db")
    with run_proxy(ProxyConfig(db=db, upstream=upstream, port=0, api_key="k")) as proxy:
        proxy.app.mount("/ui", create_viewer(db, api_key="k"))
        hrl = HarnessRL(proxy.url, api_key="k")

        def record(content: str) -> str:
            with hrl.rollout(task_id="keyed") as ro:
                openai.OpenAI(base_url=ro.base_url("solo"), api_key="k", max_retries=0).chat.completions.create(
                    model="m", messages=[{"role": "user", "content": content}], max_tokens=4)
            return ro.id

        first = record("hi")
        rows = "[...document.querySelectorAll('tr[data-rollout]')].map(r => r.dataset.rollout)"
        with chromium_page(CHROMIUM, tmp_path / "cdp") as tab:
            tab.goto(proxy.url + "/ui/")
            assert tab.eval("document.querySelector('form#login input[type=password]') !== null")
            assert tab.eval(rows) == []
            tab.eval("document.getElementById('key').value = 'k'; document.getElementById('login').submit()")
            tab.wait_for(f"{rows}.includes('{first}')")
            assert tab.eval("location.pathname") == "/ui/"
            tab.eval("window.loadedOnce = true; document.getElementById('live').click()")
            second = record("a second one")
            tab.wait_for(f"{rows}.includes('{second}')")  # the live refresh is signed in too
            assert tab.eval("window.loadedOnce === true")
            tab.goto(f"{proxy.url}/ui/rollouts/{first}")
            assert tab.eval("document.querySelectorAll('details.call').length") == 1
            assert tab.eval("document.cookie") == ""  # HttpOnly: the page's script cannot read it
        with chromium_page(CHROMIUM, tmp_path / "cdp-link") as tab:
            tab.goto(proxy.url + "/ui/?key=k")
            tab.wait_for(f"{rows}.includes('{first}')")
            assert tab.eval("location.href") == proxy.url + "/ui/"


@pytest.fixture(scope="module")
def long_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("long")
    db = str(tmp / "runs.db")
    ids = insert_long_session(db)
    viewer = create_viewer(db)
    with serve(standalone(viewer)) as url:
        yield url + "/ui", ids, tmp
    viewer.state.engine.dispose()


MAIN_ROWS = "[...document.querySelectorAll('details.call')].filter(d => !d.closest('details.side'))"


def test_a_100_turn_session_stays_readable(long_site, shots):
    """A CLI coding session of 100 tool turns (viewer_fixtures.insert_long_session): the chain
    is drawn flat (one left edge for 100 calls, the refused attempt one step in), the page opens
    on the main agent with the side agents folded, rows are one line each, and a call's tool
    schemas and tool results open on a click."""
    url, ids, tmp = long_site
    with chromium_page(CHROMIUM, tmp / "cdp") as tab:
        tab.send("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)
        tab.goto(f"{url}/rollouts/{ids['rollout']}")
        assert tab.eval("document.querySelector('details.call').id") == f"call-{ids['main'][0]}"  # not the title call
        lefts = dict(tab.eval(f"{MAIN_ROWS}.map(d => [d.id, d.getBoundingClientRect().left])"))
        assert len(lefts) == 101  # 100 turns and the refused first attempt of turn 40
        spine = {lefts[f"call-{c}"] for c in ids["main"]}
        assert len(spine) == 1  # flat: a staircase would move each turn right
        fork = lefts[f"call-{ids['error']}"] - spine.pop()
        assert 10 < fork < 40  # the refused attempt forks off turn 39: one step in
        refused = f"document.getElementById('call-{ids['error']}')"
        assert RATE_LIMITED in tab.eval(f"{refused}.querySelector('summary').innerText")  # its reason, unopened
        assert tab.eval(f"{refused}.querySelector('.preview').getBoundingClientRect().width") > 100
        assert tab.eval(f"Math.max(...{MAIN_ROWS}.map(d => d.getBoundingClientRect().height))") < 40  # one line each
        height = tab.eval("document.documentElement.scrollHeight")
        assert height < 101 * 40 + 1500, height  # rows, the timeline and the rewards: no walls of text
        sides = tab.eval("[...document.querySelectorAll('details.side')].map(d => [d.open, "
                         "d.querySelectorAll('details.call').length, "
                         "[...d.querySelectorAll('details.call')].filter(c => c.checkVisibility()).length, "
                         "d.getBoundingClientRect().height < 40])")
        assert sides == [[False, 2, 0, True], [False, 3, 0, True]]  # haiku's two calls, the explore sub-agent: folded
        tab.eval(f"{refused}.scrollIntoView({{block: 'center'}})")
        tab.screenshot(shots / "viewer-long-session.png")

        first = f"document.getElementById('call-{ids['main'][0]}')"
        assert tab.eval(f"{MAIN_ROWS}.filter(d => d.querySelector('details.schemas')).length") == 1  # sent once
        tab.click(f"{first}.querySelector('summary')")
        assert tab.eval(f"{first}.open")
        params = f"{first}.querySelector('details.schemas pre.params')"
        assert not tab.eval(f"{params}.checkVisibility()")  # the schemas are folded in the open call
        tab.click(f"{first}.querySelector('details.schemas > summary')")
        assert tab.eval(f"{params}.checkVisibility() && {params}.getBoundingClientRect().height") > 20
        assert '"command"' in tab.eval(f"{params}.innerText")
        # a schema's description with markup (the Read tool's) is text: no image element, no handler ran
        assert ONERROR in tab.eval(f"{first}.querySelector('details.schemas').innerText")
        assert tab.eval("document.querySelectorAll('img').length === 0 && !document.body.hasAttribute('data-pwned')")

        second = f"document.getElementById('call-{ids['main'][1]}')"
        result = f"{second}.querySelector('details.tool-result pre')"
        tab.click(f"{second}.querySelector('summary')")
        assert not tab.eval(f"{result}.checkVisibility()")
        tab.click(f"{second}.querySelector('details.tool-result > summary')")
        assert tab.eval(f"{result}.checkVisibility()") and "case0: 1 passed" in tab.eval(f"{result}.innerText")

        # live refresh swaps the page for a fresh copy, keeping what was opened (and closed)
        tab.eval("window.before = document.getElementById('content'); document.getElementById('live').click()")
        tab.wait_for("document.getElementById('content') !== window.before")
        assert tab.eval(f"{first}.open && {second}.open && {params}.checkVisibility() && {result}.checkVisibility()")
        assert tab.eval(f"{MAIN_ROWS}.filter(d => d.open).length") == 2
        tab.screenshot(shots / "viewer-long-session-open.png")
