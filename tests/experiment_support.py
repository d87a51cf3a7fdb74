"""Rows of results.csv for tests of the experiments' analysis, built from a
few fields (the rest: plausible defaults, throughput consistent with them)."""

from __future__ import annotations

from typing import Any

from snapcut.experiments.analysis import Row


def make_row(
    protocol: str,
    interval_s: float | None,
    repetition: int = 0,
    runtime_s: float = 0.1,
    **fields: Any,
) -> Row:
    """One run; `fields` overrides any other column of `Row`."""
    records = int(fields.pop("records", 1000))
    values: dict[str, Any] = {
        "experiment": "interval",
        "scenario": "",
        "protocol": protocol,
        "interval_s": interval_s,
        "keys": 100,
        "parallelism": 2,
        "records": records,
        "repetition": repetition,
        "order": 0,
        "runtime_s": runtime_s,
        "wall_s": runtime_s + 0.1,
        "throughput_rps": records / runtime_s,
        "checkpoints": 0 if interval_s is None else 3,
        "checkpoint_ms_median": 0.0 if interval_s is None else 1.0,
        "checkpoint_ms_max": 0.0 if interval_s is None else 2.0,
        "state_bytes_max": 0,
        "stall_s": 0.0,
        "alignment_ms_max": 0.0 if interval_s is None else 0.5,
        "logged_records_max": 0,
    }
    values.update(fields)
    return Row(**values)
