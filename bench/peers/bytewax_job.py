"""bytewax 0.21: one configuration, one JSON line (run with bench/peers/.venv-bytewax).

Input: the same records as snapcut's generator (common.dwell_batch, bit for
bit), from a FixedPartitionedSource with one partition per worker (each
worker generates its share, 4096 records per batch) whose snapshot is its
offset, so recovery is exactly-once-capable.

dwell: key_on(user) -> stateful_map (count, total) -> a sink that drops
every update. bytewax's stateful_map emits one update per record (as Flink
SQL's group aggregation does); snapcut emits one row per key at the end.
three-shuffle: three stateful_map stages keyed by user, dwell_ms, user
(every record forwarded, as in snapcut's paper job) -> the dropping sink.

Checkpointing: off = no recovery (bytewax's default 10 s epoch); 1s / 100ms =
RecoveryConfig on SQLite partitions made by `python -m bytewax.recovery`
(one per worker), epoch_interval 1 s / 100 ms: every epoch each stateful
step snapshots the keys it changed into the SQLite DB.

Timed: `cli_main` (workers start, run to the end of input, stop), i.e. the
whole execution; the dataflow is built and the recovery DB created before
the clock starts. Workers: `--parallelism` threads in one process (GIL).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

BATCH = 4096
DEFAULT_EPOCH = timedelta(seconds=10)


def build(args: Any, counts: dict[str, int]) -> Any:
    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
    from bytewax.outputs import DynamicSink, StatelessSinkPartition

    records, keys, parts = args.records, args.keys, args.parallelism

    class Part(StatefulSourcePartition[tuple[int, int], int]):
        def __init__(self, index: int, resume: int | None) -> None:
            # Partition p generates records p*n/parts .. (p+1)*n/parts.
            self.stop = records * (index + 1) // parts
            self.pos = resume if resume is not None else records * index // parts

        def next_batch(self) -> list[tuple[int, int]]:
            if self.pos >= self.stop:
                raise StopIteration
            end = min(self.pos + BATCH, self.stop)
            user, dwell = common.dwell_batch(common.SEED, self.pos, end, keys)
            self.pos = end
            return list(zip(user, dwell, strict=True))

        def snapshot(self) -> int:
            return self.pos

    class Source(FixedPartitionedSource[tuple[int, int], int]):
        def list_parts(self) -> list[str]:
            return [str(p) for p in range(parts)]

        def build_part(self, step_id: str, for_part: str, resume: int | None) -> Part:
            return Part(int(for_part), resume)

    class Drop(StatelessSinkPartition[Any]):
        def write_batch(self, items: list[Any]) -> None:
            counts["out"] = counts.get("out", 0) + len(items)

    class DropSink(DynamicSink[Any]):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Drop:
            return Drop()

    def count_sum(state: tuple[int, int] | None, ev: tuple[int, int]) -> Any:
        c, t = state if state is not None else (0, 0)
        new = (c + 1, t + ev[1])
        return new, new

    def forward_count_sum(state: tuple[int, int] | None, ev: tuple[int, int]) -> Any:
        c, t = state if state is not None else (0, 0)
        return (c + 1, t + ev[1]), ev

    def forward_count_max(state: tuple[int, int] | None, ev: tuple[int, int]) -> Any:
        c, m = state if state is not None else (0, -1)
        return (c + 1, max(m, ev[0])), ev

    flow = Dataflow("peers_" + args.job.replace("-", "_"))
    events = op.input("source", flow, Source())
    if args.job == "dwell":
        keyed = op.key_on("by_user", events, lambda e: str(e[0]))
        out = op.stateful_map("stage", keyed, count_sum)
    else:
        s1 = op.stateful_map(
            "stage1", op.key_on("k1", events, lambda e: str(e[0])), forward_count_sum
        )
        s1 = op.key_rm("u1", s1)
        s2 = op.stateful_map("stage2", op.key_on("k2", s1, lambda e: str(e[1])), forward_count_max)
        s2 = op.key_rm("u2", s2)
        out = op.stateful_map("stage3", op.key_on("k3", s2, lambda e: str(e[0])), count_sum)
    op.output("sink", out, DropSink())
    return flow


def main(argv: list[str] | None = None) -> None:
    args = common.parser("bytewax", ("recovery",), "recovery").parse_args(argv)
    from importlib.metadata import version

    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.run import cli_main

    counts: dict[str, int] = {}
    flow = build(args, counts)
    interval = common.INTERVAL_S[args.checkpointing]
    work = Path(tempfile.mkdtemp(prefix="peers-bytewax-", dir=args.workdir))
    db = work / "recovery"
    try:
        if interval is None:
            recovery, epoch = None, DEFAULT_EPOCH
        else:
            db.mkdir()
            init_db_dir(db, args.parallelism)
            recovery, epoch = RecoveryConfig(db), timedelta(seconds=interval)
        started = time.perf_counter()
        with common.DirWatcher(db, period_s=0.2) as watch:
            cli_main(
                flow,
                workers_per_process=args.parallelism,
                epoch_interval=epoch,
                recovery_config=recovery,
            )
        seconds = time.perf_counter() - started
        epochs = _epochs(db) if recovery is not None else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    expected = args.records  # one update per record, for both jobs
    if counts.get("out", 0) != expected:
        common.fail(f"the sink saw {counts.get('out', 0)} updates, expected {expected}")
    common.emit(
        args,
        "bytewax",
        seconds=seconds,
        timed="bytewax.run.cli_main: workers start, whole input, workers stop",
        checkpoints=epochs,
        checkpoints_note="epochs committed to the recovery DB (0 without recovery)",
        epoch_s=epoch.total_seconds(),
        checkpoint_bytes=watch.max_bytes,
        checkpoint_bytes_note="largest size of the SQLite recovery partitions seen during the run",
        versions={"bytewax": version("bytewax")},
    )


def _epochs(db: Path) -> int:
    """The highest epoch committed to any recovery partition (epochs start at 1)."""
    import sqlite3

    best = 0
    for f in db.glob("*.sqlite3"):
        con = sqlite3.connect(f)
        try:
            row = con.execute("SELECT MAX(commit_epoch) FROM commits").fetchone()
            best = max(best, int(row[0] or 0))
        finally:
            con.close()
    return best


if __name__ == "__main__":
    main()
