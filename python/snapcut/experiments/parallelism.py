"""Experiment 5: parallelism 1, 2, 4, 8 tasks per operator on this machine.
With 2 cores, more tasks than cores cannot scale: this shows the cost of
the protocols as tasks multiply, not speed-up.
"""

from __future__ import annotations

from pathlib import Path

from snapcut.experiments import plots
from snapcut.experiments.analysis import Summary
from snapcut.experiments.base import Experiment, Timelines
from snapcut.experiments.grid import Cell, Preset, sweep

PROTOCOLS = ("none", "aligned", "sync")


def cells(p: Preset, protocols: tuple[str, ...] | None) -> list[Cell]:
    out: list[Cell] = []
    for par in p.parallelisms:
        out.extend(
            sweep(
                "parallelism",
                protocols or PROTOCOLS,
                (p.parallel_interval,),
                keys=p.keys,
                parallelism=par,
                records=p.parallel_records,
            )
        )
    return out


def plot(summaries: list[Summary], _timelines: Timelines, outdir: Path) -> list[Path]:
    plt = plots.pyplot()
    mine = [s for s in summaries if s.cell.experiment == "parallelism"]
    if not mine:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plots.lines(
        ax,
        mine,
        lambda s: float(s.cell.parallelism),
        lambda s: (
            s.throughput_median / 1e6,
            s.cell.records / s.runtime_max / 1e6,
            s.cell.records / s.runtime_min / 1e6,
        ),
    )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tasks per operator")
    ax.set_ylabel("throughput (M records/s), median, min-max")
    ax.set_title("Throughput vs parallelism (2 cores: no speed-up beyond 2 expected)")
    ax.legend()
    return [plots.save(fig, outdir / "parallelism_throughput.png")]


EXPERIMENT = Experiment(
    name="parallelism",
    number=5,
    title="Parallelism",
    question="how do the protocols behave as tasks per operator multiply (on 2 cores)?",
    cells=cells,
    plot=plot,
    windowed=True,
)
