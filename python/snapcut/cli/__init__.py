"""The `snapcut` command line: one subcommand per job or tool."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from snapcut import __version__

Command = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="snapcut",
        description="Consistent global snapshots for streaming dataflows.",
    )
    parser.add_argument("--version", action="version", version=f"snapcut {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_subcommands(sub)
    return parser


def _add_subcommands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Each subcommand module registers itself here; imports stay lazy so that
    `snapcut --version` does not load Spark or the runtime."""
    from snapcut.cli import chaos, demo, snapshots, spark
    from snapcut.experiments import cli as experiments

    for command in (demo, chaos, snapshots, spark, experiments):
        command.add_parser(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Command | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    return handler(args)
