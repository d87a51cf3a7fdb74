"""One measured run of an experiment cell on snapcut's runtime (the jobs are
in :mod:`snapcut.experiments.flows`)."""

from __future__ import annotations

import shutil
import statistics
import threading
import time
from pathlib import Path

import pyarrow.compute as pc

from snapcut import snapshots
from snapcut._core import TaskError
from snapcut.checkpointing import Checkpointing
from snapcut.dataflow import JobControl, RunReport
from snapcut.experiments.flows import LAST_STAGE, SOURCE, build, build_scenario
from snapcut.experiments.grid import ALIGNED_TIMEOUT, ALIGNMENT_TIMEOUT_S, Cell
from snapcut.experiments.measurement import Measurement


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
