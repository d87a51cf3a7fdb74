"""Experiment 3: the stall timeline — throughput per 50 ms bucket during one
run, for ABS (aligned) vs the synchronous baseline at the same interval.
A synchronous checkpoint shows as empty buckets at the source (paused) and
the last stage (drained); ABS keeps the records flowing.
"""

from __future__ import annotations

from pathlib import Path

from snapcut.experiments import plots
from snapcut.experiments.analysis import Summary
from snapcut.experiments.base import Experiment, Timelines
from snapcut.experiments.grid import Cell, Preset, sweep

PROTOCOLS = ("none", "aligned", "sync")


def cells(p: Preset, protocols: tuple[str, ...] | None) -> list[Cell]:
    return sweep(
        "timeline",
        protocols or PROTOCOLS,
        (p.timeline_interval,),
        keys=p.keys,
        parallelism=p.parallelism,
        records=p.timeline_records,
        timeline=True,
    )


def plot(_summaries: list[Summary], timelines: Timelines, outdir: Path) -> list[Path]:
    plt = plots.pyplot()
    mine = sorted(
        ((c, m) for c, m in timelines.items() if c.experiment == "timeline"),
        key=lambda cm: (
            list(plots.COLORS).index(cm[0].protocol) if cm[0].protocol in plots.COLORS else 99
        ),
    )
    if not mine:
        return []
    fig, axes = plt.subplots(len(mine), 1, figsize=(9, 2.2 * len(mine)), sharex=True, squeeze=False)
    for ax, (cell, m) in zip(axes[:, 0], mine, strict=True):
        b = m.bucket_s or 0.05
        t = [i * b for i in range(len(m.source_timeline))]
        ax.plot(t, [n / b / 1e6 for n in m.source_timeline], label="source", color="grey")
        t3 = [i * b for i in range(len(m.last_stage_timeline))]
        ax.plot(
            t3,
            [n / b / 1e6 for n in m.last_stage_timeline],
            label="last stage",
            color=plots.COLORS.get(cell.protocol),
        )
        for start, end in m.checkpoint_windows:
            ax.axvspan(start, max(end, start + b / 4), color="red", alpha=0.15)
        iv = "" if cell.interval_s is None else f" every {cell.interval_s:g} s"
        ax.set_title(f"{cell.protocol}{iv}: longest stall {m.stall_s:.2f} s", fontsize=10)
        ax.set_ylabel("M records/s")
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel(f"time since start (s), {mine[0][1].bucket_s * 1e3:g} ms buckets")
    return [plots.save(fig, outdir / "timeline.png")]


EXPERIMENT = Experiment(
    name="timeline",
    number=3,
    title="Stall timeline",
    question="where does a synchronous snapshot stall the job, and for how long?",
    cells=cells,
    plot=plot,
)
