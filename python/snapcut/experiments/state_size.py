"""Experiment 2: state size — the same job with 10k → 10M keys, checkpoints
every 1 s and every 100 ms. Sync writes every task's whole state while the
job stands still; ABS captures only the keys changed since the last
checkpoint and writes them in the background.
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
    for keys in p.state_keys:
        out.extend(
            sweep(
                "state-size",
                protocols or PROTOCOLS,
                p.state_intervals,
                keys=keys,
                parallelism=p.parallelism,
                records=p.state_records,
            )
        )
    return out


def plot(summaries: list[Summary], _timelines: Timelines, outdir: Path) -> list[Path]:
    plt = plots.pyplot()
    mine = [s for s in summaries if s.cell.experiment == "state-size" and s.cell.interval_s]
    if not mine:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plots.lines(
        ax,
        mine,
        lambda s: float(s.cell.keys),
        plots.slowdown,
        label=lambda s: f"{s.cell.protocol} @ {s.cell.interval_s:g} s",
        linestyle=lambda s: "--" if (s.cell.interval_s or 0) < 1 else "-",
    )
    # Sync's runaway (x100 and more) and ABS's few percent on one plot.
    ax.axhline(1, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("distinct keys (state per stage grows with them)")
    ax.set_ylabel("runtime / runtime of none, same round (log)")
    ax.set_title("Checkpointing overhead vs state size")
    ax.legend(fontsize=8)
    return [plots.save(fig, outdir / "state_size_overhead.png")]


EXPERIMENT = Experiment(
    name="state-size",
    number=2,
    title="State size",
    question="where does the synchronous stall become visible as state grows?",
    cells=cells,
    plot=plot,
    windowed=True,
)
