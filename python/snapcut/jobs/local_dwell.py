"""The job `snapcut chaos` kills and restarts: ``python -m snapcut.jobs.local_dwell ...``.

The reference dwell-time job at parallelism 2: generated ``(user, dwell_ms)``
events → a throttle (so that checkpoints fall inside the run) → two
exactly-once Arrow sinks: the raw events (``<out>/events``, committed at
every checkpoint) and, after ``key_by(user)``, count/total/mean per user
(``<out>/agg``): with ``--keyed-state aggregate`` (the default) the
built-in aggregate's rows, emitted when the input ends; with
``--keyed-state process`` a Python keyed process's running rows, one per
call (so a user's row with the largest count is its final one). Checkpoints go to a
SnapshotStore at ``--checkpoint-dir``; ``--resume`` restores the newest
intact one.

Protocol with the harness: one line ``running`` on stdout when the job
starts, then a JSON line with what the run restored from when it ends.
``--unsafe-sink`` writes the events with a plain, non-transactional writer
instead (a file per batch, at once): replays then duplicate records, which
the harness must catch.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from snapcut.checkpointing import Checkpointing
from snapcut.dataflow import Dataflow

PARALLELISM = 2

#: What keeps the per-user state (``--keyed-state``).
KEYED_STATES = ("aggregate", "process")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m snapcut.jobs.local_dwell", description=__doc__)
    p.add_argument("--protocol", required=True)
    p.add_argument("--records", type=int, required=True)
    p.add_argument("--users", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--interval", type=float, required=True, help="seconds between checkpoints")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--throttle-ms", type=float, default=2.0, help="sleep per batch")
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--unsafe-sink", action="store_true")
    p.add_argument("--no-fsync", action="store_true", help="checkpoints are not fsynced")
    p.add_argument("--failover", default="region", help="Checkpointing.failover")
    p.add_argument("--full-every", type=int, default=10, help="Checkpointing.full_every")
    p.add_argument("--state-memory", default=None, help="Checkpointing.state_memory")
    p.add_argument("--spill-dir", default=None, help="Checkpointing.spill_dir")
    p.add_argument(
        "--keyed-state",
        choices=KEYED_STATES,
        default="aggregate",
        help="what keeps the per-user state: the built-in aggregate or a Python keyed process",
    )
    return p.parse_args(argv)


def throttle(ms: float) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(ms / 1000)
        return batch

    return slow


def unsafe_writer(directory: str) -> Callable[[pa.RecordBatch], None]:
    """Writes every batch to its own visible file at once: no two-phase commit."""
    os.makedirs(directory, exist_ok=True)
    counter = itertools.count()

    def write(batch: pa.RecordBatch) -> None:
        path = os.path.join(directory, f"unsafe-{os.getpid()}-{next(counter)}.arrow")
        with ipc.new_file(path, batch.schema) as w:
            w.write_batch(batch)

    return write


def build(args: argparse.Namespace) -> Dataflow:
    flow = Dataflow(parallelism=PARALLELISM)
    events = flow.generate_dwell_events(
        users=args.users, count=args.records, seed=args.seed, batch_size=args.batch_size
    )
    slow = events.map(throttle(args.throttle_ms), name="throttle")
    events_dir = os.path.join(args.output_dir, "events")
    if args.unsafe_sink:
        write = unsafe_writer(events_dir)

        def tap(batch: pa.RecordBatch) -> pa.RecordBatch:
            write(batch)
            return batch

        slow = slow.map(tap, name="unsafe-tap")
    else:
        slow.write_arrow(events_dir, name="events-sink")
    if args.keyed_state == "process":
        agg = slow.key_by("user").process(running_dwell, name="dwell")
    else:
        agg = slow.key_by("user").aggregate(
            name="dwell",
            count="count",
            total=("sum", "dwell_ms"),
            mean=("mean", "dwell_ms"),
        )
    agg.write_arrow(os.path.join(args.output_dir, "agg"), name="agg-sink")
    return flow


def running_dwell(
    user: int, rows: pa.RecordBatch, state: tuple[int, int] | None
) -> tuple[pa.RecordBatch, tuple[int, int]]:
    """The keyed process of ``--keyed-state process``: a user's count and
    total so far, and its row (count, total, mean) after this call."""
    count, total = state or (0, 0)
    count += rows.num_rows
    total += sum(rows["dwell_ms"].to_pylist())
    row = {"user": [user], "count": [count], "total": [total], "mean": [total / count]}
    return pa.RecordBatch.from_pydict(row), (count, total)


def supports_recovery() -> bool:
    """Whether `Dataflow.run` takes `checkpoint_dir`/`resume` (durable recovery)."""
    return "checkpoint_dir" in inspect.signature(Dataflow.run).parameters


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    flow = build(args)
    checkpointing = Checkpointing(
        protocol=args.protocol,
        interval=args.interval,
        retained=2,
        failover=args.failover,
        full_every=args.full_every,
        state_memory=args.state_memory,
        spill_dir=args.spill_dir,
    )
    kwargs: dict[str, Any] = {}
    if supports_recovery():
        kwargs = {"checkpoint_dir": args.checkpoint_dir, "resume": args.resume}
        if args.no_fsync:
            kwargs["fsync"] = False
    print("running", flush=True)
    report = flow.run(checkpointing, **kwargs)
    restored = getattr(report, "restored_from", None)
    skipped = getattr(report, "skipped", None) or []
    print(
        json.dumps(
            {
                "restored_from": restored if restored is None else int(restored),
                "skipped": len(skipped),
                "checkpoints": len(report.completed_checkpoints),
                "recovery": bool(kwargs),
                # What the tasks' spilling state did, summed (state_memory).
                "spill_flushes": sum(t["flushes"] for t in report.spill.values()),
                "spill_merges": sum(t["merges"] for t in report.spill.values()),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
