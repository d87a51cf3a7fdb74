"""The ABS paper's figure with intervals: runtime relative to no snapshots
vs the snapshot interval, for none, ABS and sync, each point the windowed
median with its 95 % interval as the error bar (experiment 1); and the same
against state size (experiment 2)."""

from __future__ import annotations

from pathlib import Path

from snapcut.experiments import plots
from snapcut.experiments.effects import WHOLE_RUNS, Effect

FILE = "interval_paper_figure.png"
STATE_FILE = "state_size_intervals.png"
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


def state_figure(effects: list[Effect], outdir: Path) -> list[Path]:
    """`STATE_FILE`: runtime relative to none vs keys, one line per protocol
    and interval, 95 % intervals as error bars (log axes: sync's runaway and
    ABS's few percent on one plot)."""
    mine = [e for e in effects if e.cell.experiment == "state-size" and e.cell.interval_s]
    if not mine:
        return []
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by: dict[tuple[str, float], list[Effect]] = {}
    for e in mine:
        by.setdefault((e.cell.protocol, e.cell.interval_s or 0.0), []).append(e)
    for i, ((proto, iv), es) in enumerate(sorted(by.items())):
        es.sort(key=lambda e: e.cell.keys)
        dodge = 1 + DODGE * (i - (len(by) - 1) / 2)
        ax.errorbar(
            [e.cell.keys * dodge for e in es],
            [1 + e.overhead for e in es],
            yerr=[[e.overhead - e.low for e in es], [e.high - e.overhead for e in es]],
            marker="o",
            capsize=3,
            label=f"{proto} @ {iv:g} s",
            color=plots.COLORS.get(proto),
            linestyle="--" if iv < 1 else "-",
        )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("distinct keys (state per stage grows with them)")
    ax.set_ylabel("runtime / runtime without snapshots (log)")
    ax.set_title("Overhead vs state size (windowed median, 95 % interval)")
    ax.legend(fontsize=8)
    return [plots.save(fig, outdir / STATE_FILE)]
