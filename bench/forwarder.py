"""A bare forwarder: the proxy's server stack (uvicorn with uvloop and httptools) and its upstream
connection pool, and nothing else: no parsing, rewriting or recording. `proxy_overhead.py` runs
it beside the proxy, under the same load, as the floor of what a proxy process built on this
stack costs on the machine; the proxy's cost above it is harnessrl's own work.

    python bench/forwarder.py --upstream http://127.0.0.1:8001 --port 8002 [--server uvicorn|granian]

`--server granian` serves the same ASGI app on granian (a Rust HTTP server; one worker process,
uvloop), to compare the two stacks under the same load.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from harnessrl.proxy.upstream.http_pool import Pool


def forwarder(upstream: str):
    pool: list[Pool] = []  # made on the first request: a pool belongs to the running loop

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if not pool:
            pool.append(Pool(upstream, timeout=60))
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if b'"stream":true' in body:  # the load generator's compact JSON; a forwarder parses nothing
            resp, chunks = await pool[0].stream("POST", scope["path"], body)
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", b"text/event-stream")]})
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        resp = await pool[0].request("POST", scope["path"], body)
        await send({"type": "http.response.start", "status": resp.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(resp.body)).encode())]})
        await send({"type": "http.response.body", "body": resp.body})

    return app


def from_env():
    """The forwarder of $HARNESSRL_FORWARD_TO (granian's factory: its worker process imports this)."""
    return forwarder(os.environ["HARNESSRL_FORWARD_TO"])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--server", choices=("uvicorn", "granian"), default="uvicorn")
    args = ap.parse_args()
    if args.server == "granian":
        from granian import Granian

        os.environ["HARNESSRL_FORWARD_TO"] = args.upstream
        Granian("forwarder:from_env", address="127.0.0.1", port=args.port, interface="asgi", loop="uvloop",
                factory=True, backlog=4096, log_level="warning", working_dir=Path(__file__).resolve().parent).serve()
    else:
        import uvicorn

        uvicorn.run(forwarder(args.upstream), host="127.0.0.1", port=args.port, loop="uvloop", http="httptools",
                    lifespan="off", access_log=False, log_level="warning", backlog=4096, timeout_keep_alive=75)
