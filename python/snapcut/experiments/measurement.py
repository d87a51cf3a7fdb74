"""What one run of one experiment cell measured."""

from __future__ import annotations

from dataclasses import dataclass


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
    batch_s: tuple[tuple[float, ...], ...] = ()
    """Experiment 7 (Spark): per query round of this turn, the seconds of
    each measured micro-batch."""
