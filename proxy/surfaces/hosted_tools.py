"""What the Responses and Anthropic surfaces do with a declared tool the model cannot call through
this proxy: a hosted (server-side) tool — web search, code execution, file search, a server-run
tool search — runs inside the provider's API, mid-answer, and this proxy runs none.

By default such a tool is removed from what the model sees and the call is recorded with the
removal (`Request.notes["harnessrl_removed_tools"]`: path, type and name of each), so a harness
that merely offers web search still runs; with `--strict-tools` (`ProxyConfig.strict_tools`) the
request is refused with a 400 naming the tool instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

from harnessrl.proxy.errors import ProxyError, bad_request
from harnessrl.proxy.surfaces.adapter import Adapter

REMOVED_NOTE = "harnessrl_removed_tools"
_SURFACES = ("responses", "messages", "v1beta/models")  # the adapters whose request function takes `strict_tools`


@dataclass
class Removed:
    """The hosted tools of one request: refused at once (`strict`) or collected for its record."""

    strict: bool = False
    tools: list[dict] = field(default_factory=list)

    def hosted(self, path: str, kind: str, name: str | None) -> None:
        if self.strict:
            raise hosted_refused(path, kind)
        self.tools.append({"path": path, "type": kind, "name": name})

    def notes(self) -> dict | None:
        return {REMOVED_NOTE: self.tools} if self.tools else None


def hosted_refused(path: str, kind: str) -> ProxyError:
    return bad_request(f"{path}: the hosted tool {kind!r} is not run by this proxy (--strict-tools refuses it; "
                       "without it the tool is removed from what the model sees and the removal recorded)",
                       param=path, code="unsupported_tool")


def strict(adapter: Adapter) -> Adapter:
    """`adapter` refusing hosted tools (--strict-tools), where its surface has any."""
    if adapter.path not in _SURFACES:
        return adapter
    return replace(adapter, request=partial(adapter.request, strict_tools=True))
