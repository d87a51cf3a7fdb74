"""Terminal output of the command line: tables and lines, with rich on a
terminal and plain columns otherwise (so output piped to a file or a test
stays greppable)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

_STYLES = {
    "ok": "green",
    "complete": "green",
    "BROKEN": "bold red",
    "partial": "yellow",
    "held": "dim",
    "unreadable": "bold red",
}


class Out:
    """Tables and lines on stdout: rich on a terminal, plain columns otherwise."""

    def __init__(self) -> None:
        self.console = Console(highlight=False)
        self.rich = self.console.is_terminal

    def line(self, text: str = "") -> None:
        if self.rich:
            self.console.print(Text(text))
        else:
            print(text)

    def table(
        self,
        header: Sequence[str],
        rows: Sequence[Sequence[str]],
        right: Sequence[int] = (),
        title: str | None = None,
    ) -> None:
        if self.rich:
            table = Table(title=title, title_justify="left", header_style="bold")
            for i, name in enumerate(header):
                table.add_column(name, justify="right" if i in right else "left")
            for row in rows:
                table.add_row(*(Text(c, style=_STYLES.get(c, "")) for c in row))
            self.console.print(table)
            return
        # The same plain layout as `snapcut demo`'s checkpoint table.
        if title:
            print(title)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

        def fmt(r: Sequence[str]) -> str:
            cells = [
                c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ]
            return "  ".join(cells).rstrip()

        print(fmt(header))
        print("  ".join("-" * w for w in widths))
        for r in rows:
            print(fmt(r))

    def json(self, value: Any) -> None:
        print(json.dumps(value, indent=2, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        import base64

        return "base64:" + base64.b64encode(value).decode()
    return str(value)
