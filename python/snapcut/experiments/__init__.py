"""`snapcut experiment`: what does a snapshot protocol cost, and when does
stop-the-world hurt? A grid runner reproducing (and extending) the
experiments of the ABS paper (Carbone et al. 2015) on snapcut's runtime.

Experiments (one module each): 1 `interval` (runtime vs snapshot
interval), 2 `state-size`, 3 `timeline` (the stall timeline), 4
`backpressure` (a slow operator, a hot key), 5 `parallelism`, 6
`scaling-sim` (5 to 1,000 nodes in the timed simulator, calibrated on this
machine), 7 `spark` (the same question on Spark: background vs sync state
writes of `keyed_state`, against snapshots off).
`python -m snapcut.experiments --quick` or `snapcut experiment --quick`
writes results.csv (whole runs), timeline.csv, windows.csv and effects.csv
(the windowed method: every overhead cell of 1, 2, 4 and 5 with a 95 %
interval, `windows.py`), report.md and PNG plots to an output directory.
"""

from __future__ import annotations

from snapcut._core import ConfigError
from snapcut.experiments import (
    backpressure,
    interval,
    parallelism,
    scaling_sim,
    spark_writes,
    state_size,
    timeline,
)
from snapcut.experiments.base import Experiment

EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        interval.EXPERIMENT,
        timeline.EXPERIMENT,
        state_size.EXPERIMENT,
        parallelism.EXPERIMENT,
        backpressure.EXPERIMENT,
        scaling_sim.EXPERIMENT,
        spark_writes.EXPERIMENT,
    )
}
"""In the order they run: 1 and 3 first (the paper's figure and its stalls);
6 last, calibrated from 1 and 2."""


def resolve(names: list[str] | None) -> list[Experiment]:
    """Experiments by name or number ("interval", "1", "all"); a ConfigError
    names the choices for anything else."""
    if not names or names == ["all"]:
        return list(EXPERIMENTS.values())
    chosen: list[Experiment] = []
    by_number = {str(e.number): e for e in EXPERIMENTS.values()}
    for raw in names:
        for n in (x.strip() for x in raw.split(",")):
            if not n:
                continue
            e = EXPERIMENTS.get(n) or by_number.get(n)
            if e is None:
                raise ConfigError(f"unknown experiment {n!r}; use one of: {_choices()}, all")
            if e not in chosen:
                chosen.append(e)
    order = list(EXPERIMENTS.values())
    return sorted(chosen, key=order.index)


def _choices() -> str:
    return ", ".join(f"{e.name} ({e.number})" for e in EXPERIMENTS.values())


__all__ = ["EXPERIMENTS", "Experiment", "resolve"]
