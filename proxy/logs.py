"""The proxy's log lines: plain text or one JSON object a line (`--log-format json`), each line
about a call carrying its id (`call_id`) — from the `call_id` context variable set for the
request's task, or from `extra={"call_id": ...}` where a line is written off that task (the
recorder's writer thread)."""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar
from typing import Any

import orjson

call_id: ContextVar[str | None] = ContextVar("harnessrl_call_id", default=None)


class _CallId(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "call_id", None) is None:
            record.call_id = call_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"time": round(record.created, 6), "level": record.levelname.lower(),
                               "logger": record.name, "message": record.getMessage()}
        cid = getattr(record, "call_id", None)
        if cid is not None:
            out["call_id"] = cid
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        cid = getattr(record, "call_id", None)
        return f"{line} [call {cid}]" if cid is not None and cid not in line else line


def configure(fmt: str, level: str) -> dict:
    """Send every log line (harnessrl's and uvicorn's) to stderr in `fmt` at `level`; returns
    the `log_config` for uvicorn (its loggers hand their lines to this handler)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_CallId())
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         _TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet = {"level": level.upper(), "handlers": [], "propagate": True}
    return {"version": 1, "disable_existing_loggers": False,
            "loggers": {"uvicorn": quiet, "uvicorn.error": quiet, "uvicorn.access": quiet}}
