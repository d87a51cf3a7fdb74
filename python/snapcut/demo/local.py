"""`snapcut demo`: the dwell-time job, on Spark (default) or on snapcut's
own runtime (``--engine local``).

Spark: see :mod:`snapcut.demo.spark` — local[2], a generator writing event files
while the query runs, a SIGKILL of the driver midway and a restart from the
checkpoint, the result checked against pandas.

Local runtime: generated `(user, dwell_ms)` events → key_by user → count and total →
average (a Python map over Arrow batches), at parallelism 2 with aligned
(ABS) checkpoints by default. The result is checked against a plain Python
computation of the same generated events, then the checkpoints are listed.
"""

from __future__ import annotations

import argparse
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc

from snapcut._core import SnapcutError
from snapcut.checkpointing import Checkpointing
from snapcut.dataflow import Dataflow, RunReport, dwell_events


def with_average(batch: pa.RecordBatch) -> pa.RecordBatch:
    avg = pc.divide(pc.cast(batch["total"], pa.float64()), batch["count"])
    return batch.append_column("avg_ms", avg)


def build(args: argparse.Namespace) -> Dataflow:
    flow = Dataflow(parallelism=args.parallelism)
    events = flow.generate_dwell_events(users=args.users, count=args.records, seed=args.seed)
    totals = events.key_by("user").aggregate(count="count", total=("sum", "dwell_ms"))
    totals.map(with_average, name="average").collect("dwell")
    return flow


def plain_python(users: int, records: int, seed: int) -> dict[int, tuple[int, int]]:
    """(count, total) per user over the same generated events, one record at a time."""
    table = dwell_events(users, records, seed)
    acc: dict[int, list[int]] = {}
    for user, dwell in zip(table["user"].to_pylist(), table["dwell_ms"].to_pylist(), strict=True):
        slot = acc.setdefault(user, [0, 0])
        slot[0] += 1
        slot[1] += dwell
    return {u: (c, t) for u, (c, t) in acc.items()}


def check(result: pa.Table, expected: dict[int, tuple[int, int]]) -> list[str]:
    got = result.to_pydict()
    problems = []
    seen = dict(zip(got["user"], zip(got["count"], got["total"], strict=True), strict=True))
    if len(seen) != len(got["user"]):
        problems.append("a user appears twice in the result")
    for user, want in expected.items():
        if seen.get(user) != want:
            problems.append(f"user {user}: got {seen.get(user)}, expected {want}")
    problems.extend(f"unexpected user {u}" for u in seen.keys() - expected.keys())
    return problems


def checkpoint_table(report: RunReport) -> str:
    header = ("id", "status", "final", "at ms", "duration ms", "max align ms", "state B", "logged")
    rows = [
        (
            str(c.id),
            c.status,
            "yes" if c.is_final else "",
            f"{c.triggered_s * 1e3:.1f}",
            f"{c.duration_s * 1e3:.2f}",
            f"{c.max_alignment_ms:.2f}",
            str(c.state_bytes),
            str(c.logged_records),
        )
        for c in report.checkpoints
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Runs the local demo for `snapcut demo --engine local`; the exit code."""
    try:
        checkpointing = Checkpointing(
            protocol=args.protocol, interval=None if args.protocol == "none" else args.interval
        )
        flow = build(args)
        report = flow.run(checkpointing=checkpointing)
    except SnapcutError as err:
        print(f"snapcut demo: error: {err}", file=sys.stderr)
        return 2
    result = report.results["dwell"]

    started = time.perf_counter()
    expected = plain_python(args.users, args.records, args.seed)
    python_s = time.perf_counter() - started
    problems = check(result, expected)

    print(
        f"dwell-time job: {args.records:,} events, {args.users:,} users, "
        f"parallelism {args.parallelism}, protocol {report.protocol}, interval {args.interval} s"
    )
    print(
        f"ran in {report.duration_s:.3f} s ({report.throughput:,.0f} records/s); "
        f"plain Python took {python_s:.3f} s"
    )
    top = result.sort_by([("avg_ms", "descending"), ("user", "ascending")]).slice(0, args.top)
    print(f"\ntop {len(top)} users by average dwell time:")
    for user, count, avg in zip(
        top["user"].to_pylist(), top["count"].to_pylist(), top["avg_ms"].to_pylist(), strict=True
    ):
        print(f"  user {user:>6}  {count:>7,} events  avg {avg:8.2f} ms")
    if problems:
        print(f"\nMISMATCH with plain Python ({len(problems)} problems):")
        for p in problems[:10]:
            print(f"  {p}")
    else:
        print(f"\nresult matches plain Python for all {len(expected):,} users")
    completed = len(report.completed_checkpoints)
    print(f"\ncheckpoints: {len(report.checkpoints)} triggered, {completed} completed")
    if report.checkpoints:
        print(checkpoint_table(report))
    return 1 if problems else 0
