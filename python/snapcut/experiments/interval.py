"""Experiment 1: runtime vs snapshot interval (the ABS paper's figure).

A fixed number of records through the three-shuffle job, checkpoints every
50 ms … 5 s, durable to a local directory, for no checkpoints and each
protocol. The paper: as the interval shrinks, synchronous snapshots' runtime
climbs while ABS stays near the no-snapshot baseline.
"""

from __future__ import annotations

from pathlib import Path

from snapcut.experiments import plots
from snapcut.experiments.analysis import Summary
from snapcut.experiments.base import Experiment, Timelines
from snapcut.experiments.grid import ABS_AND_SYNC, Cell, Preset, sweep


def cells(p: Preset, protocols: tuple[str, ...] | None) -> list[Cell]:
    return sweep(
        "interval",
        protocols or ABS_AND_SYNC,
        p.intervals,
        keys=p.keys,
        parallelism=p.parallelism,
        records=p.records,
    )


def plot(summaries: list[Summary], _timelines: Timelines, outdir: Path) -> list[Path]:
    plt = plots.pyplot()
    mine = [s for s in summaries if s.cell.experiment == "interval"]
    with_iv = [s for s in mine if s.cell.interval_s is not None]
    out = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plots.lines(
        ax,
        with_iv,
        lambda s: s.cell.interval_s or 0.0,
        lambda s: (s.runtime_median, s.runtime_min, s.runtime_max),
    )
    for s in mine:
        if s.cell.protocol == "none":
            ax.axhspan(s.runtime_min, s.runtime_max, color="grey", alpha=0.25)
            ax.axhline(s.runtime_median, color="black", linestyle="--", label="none")
    ax.set_xscale("log")
    ax.set_xlabel("snapshot interval (s)")
    ax.set_ylabel("runtime (s), median, min-max")
    ax.set_title("Runtime vs snapshot interval")
    ax.legend()
    out.append(plots.save(fig, outdir / "interval_runtime.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    plots.lines(
        ax,
        with_iv,
        lambda s: s.cell.interval_s or 0.0,
        plots.overhead_pct,
    )
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("snapshot interval (s)")
    ax.set_ylabel("overhead vs none, same round (%)")
    ax.set_title("Checkpointing overhead vs snapshot interval")
    ax.legend()
    out.append(plots.save(fig, outdir / "interval_overhead.png"))
    return out


EXPERIMENT = Experiment(
    name="interval",
    number=1,
    title="Runtime vs snapshot interval",
    question="what does each protocol cost as checkpoints get more frequent?",
    cells=cells,
    plot=plot,
    windowed=True,
)
