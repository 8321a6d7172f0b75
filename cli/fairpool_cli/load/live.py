"""What a load run shows while it goes: a live per-tenant table on a terminal (rich Live,
four refreshes a second), else one status line every few seconds."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.live import Live

from fairpool_cli.load.report import status_line, tenant_table, title
from fairpool_cli.load.stats import LoadResult

LINE_INTERVAL = 5.0  # seconds between status lines when not on a terminal


class LiveView:
    """`with LiveView(console) as view: run_load(spec, progress=view.update)`."""

    def __init__(self, console: Console, line_interval: float = LINE_INTERVAL) -> None:
        self.console = console
        self.line_interval = line_interval
        self.live: Live | None = None
        self.last_line = time.monotonic()

    def __enter__(self) -> LiveView:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=4, transient=True)
            self.live.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.live is not None:
            self.live.stop()

    def update(self, result: LoadResult) -> None:
        if self.live is not None:
            self.live.update(tenant_table(result, title(result)))
        elif time.monotonic() - self.last_line >= self.line_interval:
            self.last_line = time.monotonic()
            self.console.print(status_line(result), highlight=False, soft_wrap=True)
