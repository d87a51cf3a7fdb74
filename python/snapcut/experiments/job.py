"""The ABS paper's job on snapcut's runtime, and one measured run of it.

Topology (built with the `Dataflow` API): a generated source of
`(user, dwell_ms)` events, then three keyed stateful stages, each behind a
hash shuffle, each keeping per-key aggregates that every checkpoint
captures:

    source ─hash(user)→ stage1 ─hash(dwell_ms)→ stage2 ─hash(user)→ stage3 → collect

stage1 and stage2 pass every record on after folding it into their state
(`aggregate(forward=True)`); stage3 emits one row per user at the end.
The keys change between shuffles, so every shuffle really moves records
between subtasks. The paper's job has six operators and three shuffles;
this one has four operators after the source (three keyed stages and the
sink) and the same three shuffles, with keyed state at each stage.
"""

from __future__ import annotations

import shutil
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc

from snapcut import snapshots
from snapcut._core import TaskError
from snapcut.checkpointing import Checkpointing
from snapcut.dataflow import DEFAULT_CHANNEL_CAPACITY, Dataflow, JobControl, RunReport
from snapcut.experiments.grid import ALIGNED_TIMEOUT, ALIGNMENT_TIMEOUT_S, Cell

SOURCE = "source"
LAST_STAGE = "stage3"


def build(
    records: int,
    keys: int,
    parallelism: int,
    seed: int = 7,
    channel_capacity: int = DEFAULT_CHANNEL_CAPACITY,
) -> Dataflow:
    flow = Dataflow(parallelism=parallelism, channel_capacity=channel_capacity)
    src = flow.generate_dwell_events(users=keys, count=records, seed=seed, name=SOURCE)
    s1 = src.key_by("user").aggregate(
        name="stage1", forward=True, count="count", total=("sum", "dwell_ms")
    )
    s2 = s1.key_by("dwell_ms").aggregate(
        name="stage2", forward=True, count="count", last_user=("max", "user")
    )
    s3 = s2.key_by("user").aggregate(name=LAST_STAGE, count="count", avg=("mean", "dwell_ms"))
    s3.collect("result")
    return flow


@dataclass(frozen=True)
class Measurement:
    """One run of one cell: a row of results.csv, plus its timeline."""

    runtime_s: float
    wall_s: float
    throughput_rps: float
    checkpoints: int
    checkpoint_ms_median: float
    checkpoint_ms_max: float
    state_bytes_max: int
    stall_s: float
    alignment_ms_max: float
    logged_records_max: int
    bucket_s: float
    source_timeline: list[int]
    last_stage_timeline: list[int]
    checkpoint_windows: list[tuple[float, float]]
    completed: float = 1.0
    """Share of the records the sources had emitted when the run ended: below
    1 only for a run stopped at its time budget (`runtime_s` then projected)."""


def longest_stall(counts: list[int], bucket_s: float) -> float:
    """Longest run of empty buckets between the first and last busy one, in seconds."""
    busy = [i for i, n in enumerate(counts) if n > 0]
    if not busy:
        return 0.0
    longest = run = 0
    for n in counts[busy[0] : busy[-1] + 1]:
        run = run + 1 if n == 0 else 0
        longest = max(longest, run)
    return longest * bucket_s


def measure(report: RunReport, wall_s: float) -> Measurement:
    periodic = [c for c in report.completed_checkpoints if not c.is_final]
    durations = [c.duration_s * 1e3 for c in periodic]
    bucket = report.timeline_bucket_s
    source = report.timeline.get(SOURCE, [])
    return Measurement(
        runtime_s=report.duration_s,
        wall_s=wall_s,
        throughput_rps=report.throughput,
        checkpoints=len(periodic),
        checkpoint_ms_median=statistics.median(durations) if durations else 0.0,
        checkpoint_ms_max=max(durations, default=0.0),
        state_bytes_max=max((c.state_bytes for c in report.completed_checkpoints), default=0),
        stall_s=longest_stall(source, bucket),
        alignment_ms_max=max((c.max_alignment_ms for c in periodic), default=0.0),
        logged_records_max=max((c.logged_records for c in periodic), default=0),
        bucket_s=bucket,
        source_timeline=source,
        last_stage_timeline=report.timeline.get(LAST_STAGE, []),
        checkpoint_windows=[(c.triggered_s, c.finished_s) for c in periodic],
    )


def checkpointing(cell: Cell) -> Checkpointing:
    if cell.protocol == "none":
        return Checkpointing(protocol="none")
    if cell.protocol == ALIGNED_TIMEOUT:
        return Checkpointing(
            protocol="unaligned",
            interval=cell.interval_s,
            alignment_timeout=ALIGNMENT_TIMEOUT_S,
        )
    return Checkpointing(protocol=cell.protocol, interval=cell.interval_s)


def stopped_at_budget(cell: Cell, root: Path, elapsed_s: float) -> Measurement:
    """A run cancelled at its budget, measured from its last committed
    checkpoint: the records its sources had emitted by then (their offsets
    in `sources.arrow`), and a runtime projected at that rate. No
    checkpoint at all: no progress known, the projected runtime is infinite."""
    snaps = snapshots.open(root) if root.exists() else None
    latest = snaps.latest() if snaps is not None and len(snaps) else None
    done = sum(latest.source_offsets().values()) if latest is not None else 0
    meta = latest.meta if latest is not None else {}
    duration_ms = float(meta.get("finished_ms", 0) - meta.get("started_ms", 0))
    return Measurement(
        runtime_s=elapsed_s * cell.records / done if done else float("inf"),
        wall_s=elapsed_s,
        throughput_rps=done / elapsed_s,
        # Ids count every checkpoint triggered (retention keeps only the last).
        checkpoints=latest.id if latest is not None else 0,
        checkpoint_ms_median=duration_ms,
        checkpoint_ms_max=duration_ms,
        state_bytes_max=sum(int(f.get("bytes", 0)) for f in latest.files) if latest else 0,
        stall_s=0.0,
        alignment_ms_max=0.0,
        logged_records_max=0,
        bucket_s=0.0,
        source_timeline=[],
        last_stage_timeline=[],
        checkpoint_windows=[],
        completed=done / cell.records,
    )


def run_cell(cell: Cell, workdir: Path, budget_s: float | None = None) -> Measurement:
    """Runs `cell` once, checkpoints durable under `workdir` (removed after).

    `budget_s`: a run with checkpoints still going after this long is
    cancelled and measured by `stopped_at_budget` (a stop-the-world
    protocol whose stall outlasts the interval barely moves: the next
    checkpoint is due the moment the last one commits)."""
    if cell.scenario:
        from snapcut.experiments.backpressure import build_scenario

        flow = build_scenario(cell)
    else:
        flow = build(cell.records, cell.keys, cell.parallelism)
    chk = workdir / "checkpoints"
    shutil.rmtree(chk, ignore_errors=True)
    cp = checkpointing(cell)
    root = None if cell.protocol == "none" else chk
    control = JobControl()
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        control.cancel()

    timer = None
    if budget_s is not None and root is not None:
        timer = threading.Timer(budget_s, stop)
        timer.daemon = True
    started = time.perf_counter()
    if timer is not None:
        timer.start()
    try:
        report = flow.run(cp, checkpoint_dir=root, control=control)
    except TaskError:
        # Only a run with a checkpoint root has a timer that can fire.
        if not fired.is_set():
            raise
        return stopped_at_budget(cell, chk, time.perf_counter() - started)
    finally:
        if timer is not None:
            timer.cancel()
        shutil.rmtree(chk, ignore_errors=True)
    wall = time.perf_counter() - started
    result = report.results["result"]
    counted = pc.sum(result["count"]).as_py() or 0
    if counted != cell.records or report.records_in != cell.records:
        raise RuntimeError(
            f"{cell.label()}: the job counted {counted:,} records at its last stage and "
            f"emitted {report.records_in:,}; expected {cell.records:,}"
        )
    return measure(report, wall)
