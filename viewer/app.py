"""The trace viewer as a FastAPI sub-application: `create_viewer(db)` is mounted at `/ui` by
`harnessrl ui` and by the running proxy (the app layer mounts it), so the same pages and JSON
endpoints exist in both.

Recorded content is attacker-controlled (model output, tool results, prompts): templates are
autoescaped, and every response carries a Content-Security-Policy that allows only this
application's own script and style files (no inline script, no inline style, nothing from
another origin).

JSON endpoints (the data the pages render, documented in docs/viewer.md):
`GET api/rollouts?…` (the list page's query parameters), `GET api/rollouts/{id}`,
`GET api/groups/{group}`, `GET api/runs`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from harnessrl.db import db_url, open_db
from harnessrl.errors import UserError
from harnessrl.viewer.auth import ViewerKey, login_form, safe_next, without_key
from harnessrl.viewer.queries import STATUSES, ListQuery, group_rollouts, list_rollouts, runs
from harnessrl.viewer.rollout import find_tokenizer, rollout_view
from harnessrl.viewer.runs import check_loop_dir, runs_view
from harnessrl.viewer.samples import Samples

HERE = Path(__file__).resolve().parent
log = logging.getLogger("harnessrl.viewer")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer"}


class NotFound(Exception):
    pass


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) if ts else ""


def _num(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(when=_when, num=_num, q=lambda s: quote(str(s), safe=""))
    env.globals["urlencode"] = urlencode
    return env


def create_viewer(db: str, samples: str | Path | None = None, loop: str | Path | None = None,
                  tokenizer: str | None = None, api_key: str | None = None) -> FastAPI:
    """The viewer over a records DB (SQLite path or URL); `samples`: a compile output directory
    (advantages, loss masks); `loop`: a `harnessrl loop` output directory (`/runs`);
    `tokenizer`: token text and classes (default: a recorded model name that is a directory, else
    the loop's current checkpoint); `api_key`: the key every page and JSON endpoint needs (`auth`)."""
    url = db_url(db)
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        raise UserError(f"records DB not found: {db}")
    compiled = Samples(samples) if samples else None
    loop_dir = check_loop_dir(loop) if loop else None
    if tokenizer and not Path(tokenizer).is_dir():
        raise UserError(f"--tokenizer {tokenizer}: not a directory")
    engine, _ = open_db(db)
    env = _templates()
    app = FastAPI(title="harnessrl viewer", openapi_url=None, docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    if api_key is not None:
        _require_key(app, ViewerKey(api_key), env)
    # the mounting proxy leaves the key check of this path to the viewer (its sign-in page)
    app.state.checks_key = api_key is not None

    @app.middleware("http")
    async def security_headers(request: Request, call_next):
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.exception_handler(UserError)
    async def _bad(request: Request, exc: UserError):
        return _error(request, 400, str(exc))

    @app.exception_handler(NotFound)
    async def _missing(request: Request, exc: NotFound):
        return _error(request, 404, str(exc))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception):
        # the text may hold SQL or the database's own message: it goes to the log, never into a page
        log.error("internal viewer error on %s %s", request.method, request.url.path, exc_info=exc)
        return _error(request, 500, f"internal viewer error ({type(exc).__name__}); see the viewer's log")

    def _error(request: Request, status: int, message: str) -> Response:
        if "/api/" in request.url.path:
            kind = {404: "not_found", 500: "server_error"}.get(status, "invalid_request_error")
            return JSONResponse({"error": {"message": message, "type": kind}}, status)
        return page(request, "error.html", {"message": message, "status": status}, status)

    def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        html = env.get_template(name).render(root=root, has_loop=loop_dir is not None, **context)
        return HTMLResponse(html, status)

    # -- data (shared by the pages and the JSON endpoints) -------------------------------
    def rollouts_data(params: dict[str, str]) -> dict[str, Any]:
        q = ListQuery.parse(params)
        data = list_rollouts(engine, q)
        data["query"] = q
        return data

    def loop_model() -> str | None:
        """A loop's current checkpoint holds the tokenizer of its rollouts (harnesses often send
        a model name that is no directory)."""
        model = runs_view(loop_dir)["model"] if loop_dir else None
        return model if model and Path(model).is_dir() else None

    found: dict[str, str] = {}  # the tokenizer directory, once found (a scan of the recorded model names)

    def rollout_data(rollout_id: str) -> dict[str, Any]:
        if "dir" not in found:
            tok = find_tokenizer(engine, tokenizer) or loop_model()
            if tok:
                found["dir"] = tok
        # no id holds U+0000 (PostgreSQL cannot even compare text holding it)
        view = rollout_view(engine, rollout_id, found.get("dir"), compiled) if "\x00" not in rollout_id else None
        if view is None:
            raise NotFound(f"no rollout {rollout_id!r} in the records DB")
        return view

    def group_data(group: str) -> dict[str, Any]:
        rows = group_rollouts(engine, group) if "\x00" not in group else []
        if not rows:
            raise NotFound(f"no rollouts in group {group!r}")
        advantages = compiled.advantages_of([r["id"] for r in rows]) if compiled else {}
        for r in rows:
            r["advantages"] = advantages.get(r["id"], [])
        values = [r["reward"] for r in rows if r["reward"] is not None]
        mean = sum(values) / len(values) if values else None
        std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else None
        return {"group": group, "rows": rows, "reward_mean": mean, "reward_std": std,
                "has_samples": compiled is not None}

    def runs_data() -> dict[str, Any]:
        if loop_dir is None:
            raise NotFound("no loop output: start the viewer with --loop DIR")
        return runs_view(loop_dir)

    # -- pages ----------------------------------------------------------------------------
    @app.get("/", response_class=HTMLResponse)
    async def rollouts_page(request: Request):
        params = dict(request.query_params)
        data = await run_in_threadpool(rollouts_data, params)
        run_tags = await run_in_threadpool(runs, engine)
        return page(request, "rollouts.html", {"data": data, "q": data["query"], "runs": run_tags,
                                               "statuses": STATUSES, "live": params.get("live") == "1"})

    @app.get("/rollouts/{rollout_id}", response_class=HTMLResponse)
    async def rollout_page(request: Request, rollout_id: str):
        view = await run_in_threadpool(rollout_data, rollout_id)
        return page(request, "rollout.html", {"v": view, "by_id": {c["id"]: c for c in view["calls"]}})

    @app.get("/groups/{group:path}", response_class=HTMLResponse)
    async def group_page(request: Request, group: str):
        return page(request, "group.html", {"g": await run_in_threadpool(group_data, group)})

    @app.get("/runs", response_class=HTMLResponse)
    async def runs_page(request: Request):
        return page(request, "runs.html", {"r": await run_in_threadpool(runs_data)})

    # -- JSON -----------------------------------------------------------------------------
    @app.get("/api/rollouts")
    async def rollouts_json(request: Request):
        data = await run_in_threadpool(rollouts_data, dict(request.query_params))
        data["query"] = data["query"].params()
        return data

    @app.get("/api/rollouts/{rollout_id}")
    async def rollout_json(rollout_id: str):
        return await run_in_threadpool(rollout_data, rollout_id)

    @app.get("/api/groups/{group:path}")
    async def group_json(group: str):
        return await run_in_threadpool(group_data, group)

    @app.get("/api/runs")
    async def runs_json():
        return await run_in_threadpool(runs_data)

    app.state.engine = engine  # mounted sub-apps get no lifespan: the mounting app disposes it
    return app


def _require_key(app: FastAPI, key: ViewerKey, env: jinja2.Environment) -> None:
    """Every request but the static files needs `key` (`auth`): unsigned, a page gets the sign-in
    form (401), a JSON endpoint a 401 error."""

    def login_page(root: str, status: int, message: str, next_url: str) -> HTMLResponse:
        html = env.get_template("login.html").render(root=root, has_loop=False, message=message, next=next_url)
        return HTMLResponse(html, status)

    @app.middleware("http")
    async def require_key(request: Request, call_next):
        root = request.scope.get("root_path", "").rstrip("/")
        path = request.url.path[len(root):] if request.url.path.startswith(root) else request.url.path
        if path.startswith("/static/"):
            return await call_next(request)
        secure = request.url.scheme == "https"
        if path == "/login" and request.method == "POST":
            given, target = login_form(await request.body())
            if not key.is_key(given):
                return login_page(root, 401, "wrong key", safe_next(target, root))
            signed = RedirectResponse(safe_next(target, root), 303)
            signed.set_cookie(**key.cookie(root, secure))
            return signed
        if "key" in request.query_params and request.method == "GET":
            # a link that carries the key: signed in, and the key taken off the address at once
            if not key.is_key(request.query_params["key"]):
                return login_page(root, 401, "wrong key", root + "/")
            signed = RedirectResponse(without_key(request.url.path, request.query_params.multi_items()), 303)
            signed.set_cookie(**key.cookie(root, secure))
            return signed
        if key.allows(dict(request.headers), dict(request.cookies)):
            return await call_next(request)
        if path.startswith("/api/"):
            return JSONResponse({"error": {"message": "missing or wrong key: send Authorization: Bearer KEY",
                                           "type": "authentication_error"}}, 401)
        query = ("?" + request.url.query) if request.url.query else ""
        return login_page(root, 401, "", safe_next(request.url.path + query, root))


def standalone(viewer: FastAPI) -> FastAPI:
    """`harnessrl ui`: the viewer at `/ui/` (the same paths as in the proxy), `/` redirecting there."""
    root = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @root.get("/")
    async def to_ui():
        return RedirectResponse("/ui/")

    root.mount("/ui", viewer)
    return root
