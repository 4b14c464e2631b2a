"""Requests through the interception addon (harnessrl/intercept_addon.py) in mitmproxy's own
environment, for tests/test_intercept.py: each request of argv[2] (a JSON list of [method, url,
headers]) goes through the addon's `request` hook with the recording proxy at argv[1] and a proxy
key; what it became (the URL and headers sent on, or the addon's own answer) is printed as JSON.

    .venv-mitm/bin/python intercept_addon_rewrites.py ADDON REQUESTS_JSON
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

from mitmproxy import http
from mitmproxy.test import taddons, tflow


def main(addon_path: str, requests: list) -> None:
    os.environ["HARNESSRL_PROXY_API_KEY"] = "hrl-proxykey"
    spec = importlib.util.spec_from_file_location("intercept_addon", addon_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    addon = module.Intercept()
    out = []
    with taddons.context(addon) as tctx:
        tctx.configure(addon, hrl_proxy="http://127.0.0.1:8123")
        for method, url, headers in requests:
            flow = tflow.tflow(req=http.Request.make(method, url, b"{}", headers))
            addon.request(flow)
            if flow.response is not None:
                out.append({"status": flow.response.status_code, "body": flow.response.get_text()})
            else:
                out.append({"url": flow.request.url, "headers": dict(flow.request.headers)})
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
