"""The job `snapcut chaos --topology fan-out` runs: ``python -m snapcut.jobs.local_fan_out ...``.

One source feeds four sinks of three kinds through a keyed stateful stage,
the data-integration shape of SeaTunnel's regional failover (one table to
many targets)::

    events (1) -> throttle (1) -> stage (2, keyed state, by user)
        -> arrow-sink (2)       two-phase-commit Arrow files    <out>/arrow
        -> idempotent-sink (2)  upserts by event id, one file per id range <out>/idempotent
        -> collect-memory (2)   in-memory collect (report.results["memory"])
        -> counts (2, keyed counts by user) -> counts-sink (2)  <out>/counts

Every event carries a unique ``id``. ``--fail SINK:SUBTASK:AT:NTH`` makes one
sink subtask fail once (a task error: `snapcut.TaskFailure`), so that
``--failover`` decides what restarts. Checkpoints go to ``--checkpoint-dir``;
``--resume`` restores the newest intact one (after a SIGKILL of the whole
process). The in-memory sink's rows are written to ``<out>/memory.arrow``
when the job ends, for the harness to read.

Protocol with the harness: ``running`` on stdout when the job starts, then a
JSON line: restarts (scope, failed task, restarted tasks, fallback),
replayed records dropped per task, checkpoints, restored_from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from snapcut.checkpointing import Checkpointing
from snapcut.dataflow import Dataflow, RunReport, TaskFailure, dwell_events
from snapcut.jobs.local_dwell import throttle

PARALLELISM = 2

#: Batches a channel holds: few, so that an aligned barrier queued behind a
#: full channel waits a few throttled batches, not 64, and checkpoints
#: complete within the run.
CHANNEL_CAPACITY = 4

#: The sinks by operator name (what a failure can be injected into), and
#: the kind each stands for.
SINKS = {
    "arrow-sink": "two-phase commit",
    "idempotent-sink": "idempotent",
    "collect-memory": "in-memory collect",
    "counts-sink": "two-phase commit, after keyed counts",
}


def events(records: int, users: int, seed: int) -> pa.Table:
    """The job's input: the dwell generator's events with a unique ``id``."""
    table = dwell_events(users, records, seed)
    return table.append_column("id", pa.array(range(records), type=pa.int64()))


def idempotent_writer(directory: str) -> Callable[[pa.RecordBatch], None]:
    """Writes each batch to a file named by its id range, by atomic rename:
    writing the same records again replaces the file with the same content,
    so a replay leaves the output as it was (an idempotent sink)."""
    os.makedirs(directory, exist_ok=True)

    def write(batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        ids = batch.column("id")
        lo, hi = pc.min(ids).as_py(), pc.max(ids).as_py()
        path = os.path.join(directory, f"ids-{lo:010d}-{hi:010d}-{batch.num_rows}.arrow")
        tmp = f"{path}.{os.getpid()}.tmp"
        with ipc.new_file(tmp, batch.schema) as w:
            w.write_batch(batch)
        os.replace(tmp, path)

    return write


@dataclass(frozen=True)
class Params:
    records: int
    users: int
    seed: int
    batch_size: int
    throttle_ms: float
    output_dir: str


def build(p: Params) -> Dataflow:
    flow = Dataflow(parallelism=PARALLELISM, channel_capacity=CHANNEL_CAPACITY)
    table = events(p.records, p.users, p.seed)
    batches = table.to_batches(max_chunksize=p.batch_size)
    src = flow.from_batches(batches, name="events", parallelism=1)
    slow = src.map(throttle(p.throttle_ms), name="throttle", parallelism=1)
    stage = slow.key_by("user").aggregate(name="stage", forward=True, seen="count")
    stage.write_arrow(os.path.join(p.output_dir, "arrow"), name="arrow-sink")
    write = idempotent_writer(os.path.join(p.output_dir, "idempotent"))

    def upsert(batch: pa.RecordBatch) -> None:
        write(batch)

    stage.map(upsert, name="idempotent-sink")
    stage.collect("memory")
    counts = stage.key_by("user").aggregate(name="counts", count="count", total=("sum", "dwell_ms"))
    counts.write_arrow(os.path.join(p.output_dir, "counts"), name="counts-sink")
    return flow


def parse_failure(spec: str) -> TaskFailure:
    """``SINK:SUBTASK:AT:NTH``, e.g. ``arrow-sink:0:commit:2``."""
    parts = spec.split(":")
    if len(parts) != 4 or parts[0] not in SINKS:
        raise argparse.ArgumentTypeError(
            f"--fail takes SINK:SUBTASK:AT:NTH with SINK one of {', '.join(SINKS)}, got {spec!r}"
        )
    try:
        return TaskFailure(parts[0], int(parts[1]), parts[2], int(parts[3]))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fail {spec!r}: SUBTASK and NTH are ints") from None


def summarize(report: RunReport) -> dict[str, Any]:
    """What the harness reads of a finished run."""
    return {
        "restored_from": report.restored_from,
        "checkpoints": len(report.completed_checkpoints),
        "restarts": [
            {
                "scope": r.scope,
                "failed": r.failed,
                "tasks": list(r.tasks),
                "fallback": r.fallback,
                "error": r.error,
                "restored_from": r.restored_from,
                "at_s": r.at_s,
                "downtime_s": r.downtime_s,
            }
            for r in report.restarts
        ],
        "replayed_dropped": report.replayed_dropped,
        "timeline_bucket_s": report.timeline_bucket_s,
        "timeline": report.timeline,
    }


def run(
    p: Params,
    checkpointing: Checkpointing,
    checkpoint_dir: str,
    *,
    resume: bool = False,
    failure: TaskFailure | None = None,
) -> dict[str, Any]:
    """Runs the job once; writes the in-memory sink's rows to
    ``<output_dir>/memory.arrow``; returns `summarize` of its report."""
    report = build(p).run(
        checkpointing, checkpoint_dir=checkpoint_dir, resume=resume, inject_failure=failure
    )
    memory = report.results["memory"]
    path = os.path.join(p.output_dir, "memory.arrow")
    with ipc.new_file(f"{path}.tmp", memory.schema) as w:
        w.write_table(memory)
    os.replace(f"{path}.tmp", path)
    return summarize(report)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m snapcut.jobs.local_fan_out", description=__doc__)
    p.add_argument("--protocol", required=True)
    p.add_argument("--failover", required=True)
    p.add_argument("--records", type=int, required=True)
    p.add_argument("--users", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--interval", type=float, required=True, help="seconds between checkpoints")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--throttle-ms", type=float, default=2.0, help="sleep per batch")
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--fail", type=parse_failure, default=None, help="SINK:SUBTASK:AT:NTH")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    params = Params(
        records=args.records,
        users=args.users,
        seed=args.seed,
        batch_size=args.batch_size,
        throttle_ms=args.throttle_ms,
        output_dir=args.output_dir,
    )
    checkpointing = Checkpointing(
        protocol=args.protocol,
        interval=args.interval,
        retained=2,
        restart_attempts=1,
        restart_delay=0,
        failover=args.failover,
    )
    print("running", flush=True)
    done = run(params, checkpointing, args.checkpoint_dir, resume=args.resume, failure=args.fail)
    print(json.dumps(done), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
