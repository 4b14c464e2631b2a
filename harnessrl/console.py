"""The rich Console every command prints through.

Off a terminal (a pipe, a log file, CI) rich assumes 80 columns and cuts table cells to fit with
"…": the loop's table lost `succe…`, `weig…` and its token counts in `make demo`'s log. Here,
when stdout (or stderr, for an error console) is not a terminal and $COLUMNS is not set, the
width is one that fits every table the commands print; on a terminal, or with $COLUMNS, rich
decides as usual.
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console as RichConsole

LOG_WIDTH = 200  # the widest table, the loop's, needs about 120


class Console(RichConsole):
    def __init__(self, *args: Any, width: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, width=width, **kwargs)
        if width is None and not self.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
            self.width = LOG_WIDTH
