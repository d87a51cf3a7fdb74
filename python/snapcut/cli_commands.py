"""Registry of the CLI's subcommands. Each adds a parser and sets `handler`."""

from __future__ import annotations

import argparse


def register_all(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds every subcommand. New commands add one line here."""
    from snapcut import chaos, demo, snapshots_cli
    from snapcut.spark import cli as spark_cli

    demo.add_parser(sub)
    chaos.add_parser(sub)
    snapshots_cli.add_parser(sub)
    spark_cli.add_parser(sub)
