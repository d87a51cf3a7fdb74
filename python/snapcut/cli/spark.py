"""``snapcut spark``: Spark-side tools on state roots.

    snapcut spark rescale ROOT --to NEW_ROOT --partitions M [--batch B]

rescale runs a Spark job (``--master``, default ``local[2]``; or on Spark
Connect with ``--remote sc://host:15002``, or ``--remote local[2]`` for a
local Connect server) that
copies committed batch B (default: the newest) of ROOT into NEW_ROOT with M
state partitions, placed by Spark's own hash of the key. Then restart the
query from its checkpointLocation with ``root=NEW_ROOT, partitions=M``.
"""

from __future__ import annotations

import argparse
import sys

import pyarrow as pa

from snapcut._core import SnapcutError


def cmd_rescale(args: argparse.Namespace) -> int:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print(
            "snapcut spark rescale: error: pyspark is not installed; pip install 'snapcut[spark]'",
            file=sys.stderr,
        )
        return 2
    from snapcut.jobs.spark_session import build_session, check_remote
    from snapcut.spark.state.rescale import plan_rescale, rescale

    try:
        if args.remote is not None:
            check_remote(args.remote, "snapcut spark rescale")
        # Bad input fails here, before a JVM starts (rescale checks again).
        plan_rescale(args.root, args.to, args.partitions, batch=args.batch)
    except (SnapcutError, OSError, pa.ArrowException) as err:
        print(f"snapcut spark rescale: error: {err}", file=sys.stderr)
        return 2
    spark = build_session("snapcut-rescale", master=args.master, remote=args.remote)
    try:
        report = rescale(spark, args.root, args.to, args.partitions, batch=args.batch)
    except (SnapcutError, OSError, pa.ArrowException) as err:
        print(f"snapcut spark rescale: error: {err}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print(
        f"batch {report.batch}: {report.rows} keys, {report.partitions_before} -> "
        f"{report.partitions_after} partitions {report.rows_per_partition}, "
        f"{report.bytes} bytes written to {report.target}\n"
        f"restart the query from its checkpointLocation with root={report.target!r}, "
        f"partitions={report.partitions_after}"
    )
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "spark",
        help="Spark-side tools on state roots (rescale)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmds = p.add_subparsers(dest="spark_command", metavar="COMMAND", required=True)
    c = cmds.add_parser(
        "rescale",
        help="copy a committed batch of a state root into a new root with M partitions",
    )
    c.add_argument("root", metavar="ROOT", help="the state root (local path or URI)")
    c.add_argument("--to", required=True, metavar="NEW_ROOT", help="a new, empty location")
    c.add_argument("--partitions", required=True, type=int, metavar="M")
    c.add_argument("--batch", type=int, default=None, help="default: the newest committed")
    c.add_argument("--master", default="local[2]", help="Spark master for the job")
    c.add_argument(
        "--remote",
        default=None,
        metavar="URL",
        help="run the job on Spark Connect instead: sc://host:15002, or local[2]",
    )
    c.set_defaults(handler=cmd_rescale)
