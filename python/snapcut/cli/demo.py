"""`snapcut demo`: the dwell-time job on Spark (:mod:`snapcut.demo.spark`, the
default) or on snapcut's own runtime (:mod:`snapcut.demo.local`)."""

from __future__ import annotations

import argparse
import sys

from snapcut._core import SnapcutError
from snapcut.checkpointing import PROTOCOLS
from snapcut.demo import local


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="run the dwell-time job with snapshots (on Spark, killed and restarted midway; "
        "or on the local runtime) and check it",
        description=local.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--engine",
        choices=("spark", "local"),
        default="spark",
        help="spark: local Spark with a driver kill and restart (default); "
        "local: snapcut's own runtime",
    )
    add_spark_arguments(p)
    g = p.add_argument_group("engine local")
    g.add_argument("--records", type=int, default=5_000_000, help="events to generate")
    p.add_argument("--users", type=int, default=1_000, help="distinct users")
    p.add_argument("--seed", type=int, default=7)
    g.add_argument("--protocol", default="aligned", choices=PROTOCOLS, help="snapshot protocol")
    g.add_argument(
        "--interval", type=float, default=0.02, help="seconds between checkpoints (default 0.02)"
    )
    g.add_argument("--parallelism", type=int, default=2)
    g.add_argument("--top", type=int, default=5, help="users to show")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    if args.engine == "spark":
        # The Spark demo needs the `spark` extra (pandas, pyspark): imported only when asked.
        from snapcut.demo.spark import run_demo

        try:
            return run_demo(args)
        except SnapcutError as err:
            print(f"snapcut demo: error: {err}", file=sys.stderr)
            return 2
    return local.main(args)


def add_spark_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine spark")
    g.add_argument("--dir", default="snapcut-demo", help="working directory (emptied first)")
    g.add_argument("--files", type=int, default=8, help="event files = micro-batches")
    g.add_argument("--rows", type=int, default=50_000, help="events per file")
    g.add_argument("--every", type=float, default=1.0, help="seconds between event files")
    g.add_argument(
        "--remote",
        default=None,
        metavar="local[N,F]",
        help="run the query on Spark Connect: a local Connect server in the query's process "
        "(killed with it), e.g. local[2,4]",
    )
    g.add_argument(
        "--kill-after",
        type=int,
        default=3,
        help="SIGKILL the driver once this many batches are committed",
    )
