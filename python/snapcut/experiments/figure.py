"""The ABS paper's figure with intervals: runtime relative to no snapshots
vs the snapshot interval, for none, ABS and sync, each point the windowed
median with its 95 % interval as the error bar (experiment 1)."""

from __future__ import annotations

from pathlib import Path

from snapcut.experiments import plots
from snapcut.experiments.effects import WHOLE_RUNS, Effect

FILE = "interval_paper_figure.png"
DODGE = 0.04
"""Relative shift of each protocol's points along the (log) interval axis."""


def paper_figure(effects: list[Effect], outdir: Path) -> list[Path]:
    """`FILE` from experiment 1's effects (nothing without any)."""
    mine = [e for e in effects if e.cell.experiment == "interval" and e.cell.interval_s]
    if not mine:
        return []
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by: dict[str, list[Effect]] = {}
    for e in mine:
        by.setdefault(e.cell.protocol, []).append(e)
    for i, (proto, es) in enumerate(by.items()):
        es.sort(key=lambda e: e.cell.interval_s or 0.0)
        # Protocols side by side at each interval, so that their bars do not hide each other.
        dodge = 1 + DODGE * (i - (len(by) - 1) / 2)
        xs = [(e.cell.interval_s or 0.0) * dodge for e in es]
        ys = [1 + e.overhead for e in es]
        err = [[e.overhead - e.low for e in es], [e.high - e.overhead for e in es]]
        ax.errorbar(
            xs,
            ys,
            yerr=err,
            marker="o",
            capsize=3,
            label=proto,
            color=plots.COLORS.get(proto),
            linestyle="--" if any(e.method == WHOLE_RUNS for e in es) else "-",
        )
    ax.axhline(1.0, color="black", linestyle="--", label="none")
    ax.set_xscale("log")
    ax.set_xlabel("snapshot interval (s)")
    ax.set_ylabel("runtime / runtime without snapshots")
    ax.set_title("Runtime vs snapshot interval (windowed median, 95 % interval)")
    ax.legend()
    return [plots.save(fig, outdir / FILE)]
