"""snapcut's runtime (`snapcut.Dataflow`): one configuration, one JSON line.

dwell: generated dwell events -> key_by(user).aggregate(count, sum) -> collect.
three-shuffle: the paper's job of `snapcut experiment` (snapcut.experiments.job.build):
three keyed stages behind three hash shuffles (user, dwell_ms, user).
Checkpoints: `Checkpointing(protocol=mode, interval=...)`, durable to a
checkpoint_dir (Arrow IPC + manifest, fsynced; the default retention of 1).

Timed: `RunReport.duration_s`, the runtime's own wall clock from the start of
the tasks to the end of the job (graph building and thread start-up excluded,
a few ms); `wall_s` is `Dataflow.run` as a whole.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

if TYPE_CHECKING:
    from snapcut import Dataflow
    from snapcut.dataflow import RunReport

#: `--store` -> `Dataflow.run(fsync=...)` (memory: no checkpoint_dir, fsync unused).
FSYNC_OF_STORE: dict[str, bool | str] = {
    "disk": True,
    "disk-perfile": "per-file",
    "disk-syncfs": "syncfs",
    "disk-nofsync": False,
    "memory": True,
}


def build_flow(
    job: str, keys: int, records: int, parallelism: int, channel_capacity: int | None = None
) -> Dataflow:
    """The peers' `job` ("dwell" or "three-shuffle") as a snapcut Dataflow;
    `channel_capacity` None: the runtime's default."""
    from snapcut import Dataflow
    from snapcut.dataflow import DEFAULT_CHANNEL_CAPACITY
    from snapcut.experiments.job import build

    capacity = DEFAULT_CHANNEL_CAPACITY if channel_capacity is None else channel_capacity
    if job == "three-shuffle":
        return build(records, keys, parallelism, seed=common.SEED, channel_capacity=capacity)
    flow = Dataflow(parallelism=parallelism, channel_capacity=capacity)
    events = flow.generate_dwell_events(users=keys, count=records, seed=common.SEED, name="source")
    events.key_by("user").aggregate(count="count", total=("sum", "dwell_ms")).collect("result")
    return flow


def checked_stats(report: RunReport, records: int) -> dict[str, float | None]:
    """Exits (status 2) unless the job counted `records` records; then the
    periodic checkpoints (the final one not counted) and the medians of their
    durations and of their longest barrier alignment, in ms."""
    import pyarrow.compute as pc

    counted = pc.sum(report.results["result"]["count"]).as_py() or 0
    if counted != records:
        common.fail(f"the job counted {counted} records, expected {records}")
    periodic = [c for c in report.completed_checkpoints if not c.is_final]
    durations = [c.duration_s * 1e3 for c in periodic]
    alignments = [c.max_alignment_ms for c in periodic]
    return {
        "checkpoints": len(periodic),
        "checkpoint_ms": statistics.median(durations) if durations else None,
        "alignment_ms": statistics.median(alignments) if alignments else None,
    }


def main(argv: list[str] | None = None) -> None:
    p = common.parser("snapcut", ("aligned", "unaligned"), "aligned")
    p.add_argument(
        "--store",
        choices=tuple(FSYNC_OF_STORE),
        default="disk",
        help="where checkpoints go: a checkpoint_dir (Arrow IPC + manifest, durable before "
        "they count: run()'s default), the same made durable with fsync per file "
        "(fsync='per-file') or with one syncfs (fsync='syncfs'; the default on Linux 5.8+), "
        "without fsync (fsync=False: what Flink does on a local directory) or memory (no "
        "checkpoint_dir: the protocol without the durable store)",
    )
    args = p.parse_args(argv)
    import snapcut
    from snapcut import Checkpointing

    flow = build_flow(args.job, args.keys, args.records, args.parallelism)

    interval = common.INTERVAL_S[args.checkpointing]
    work = Path(tempfile.mkdtemp(prefix="peers-snapcut-", dir=args.workdir))
    root = work / "checkpoints"
    try:
        if interval is None:
            cp, chk_dir = Checkpointing(protocol="none"), None
        else:
            cp = Checkpointing(protocol=args.mode, interval=interval)
            chk_dir = None if args.store == "memory" else root
        started = time.perf_counter()
        report = flow.run(cp, checkpoint_dir=chk_dir, fsync=FSYNC_OF_STORE[args.store])
        wall = time.perf_counter() - started
        chk_bytes = common.dir_bytes(root) if chk_dir is not None else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stats = checked_stats(report, args.records)
    common.emit(
        args,
        "snapcut",
        seconds=report.duration_s,
        timed="RunReport.duration_s: the runtime's clock, first task start to job end",
        wall_s=wall,
        wall_records_per_s=args.records / wall,
        startup_s=max(wall - report.duration_s, 0.0),
        checkpoints=stats["checkpoints"],
        checkpoints_note="periodic checkpoints completed (the final one not counted)",
        checkpoint_bytes=chk_bytes,
        checkpoint_bytes_note="checkpoint_dir at the end (retained=1: the last checkpoint)",
        store=args.store if interval is not None else None,
        checkpoint_ms=stats["checkpoint_ms"],
        alignment_ms=stats["alignment_ms"],
        checkpoint_ms_note="median over periodic checkpoints: trigger to completion, and "
        "the longest barrier alignment of any task",
        versions={"snapcut": snapcut.__version__},
    )


if __name__ == "__main__":
    main()
