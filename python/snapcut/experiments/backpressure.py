"""Experiment 4: backpressure and skew — a slow operator, and a hot key
feeding it; checkpoint duration, alignment time and checkpoint size for
aligned vs unaligned vs aligned-with-timeout (unaligned starting aligned,
switching after 10 ms: Flink's aligned-checkpoint timeout).

    source ─hash(user)→ stage1 ─forward→ slow (sleeps per batch) ─hash(user)→ stage3 → collect

Scenarios: `slow-operator@<ms>ms` (uniform keys; every batch of the slow
operator takes <ms> more), `hot-key@<ms>ms` (the same, and half of all
records carry one key, so one subtask of each stage gets half the load).
Under backpressure an aligned barrier waits behind full queues; an
unaligned one overtakes them and logs what it overtook.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from snapcut.experiments import plots
from snapcut.experiments.analysis import Summary
from snapcut.experiments.base import Experiment, Timelines
from snapcut.experiments.flows import SCENARIOS, scenario_name
from snapcut.experiments.grid import ALIGNED_TIMEOUT, Cell, Preset, sweep

PROTOCOLS = ("none", "aligned", "unaligned", ALIGNED_TIMEOUT)


def cells(p: Preset, protocols: tuple[str, ...] | None) -> list[Cell]:
    out: list[Cell] = []
    for kind in SCENARIOS:
        out.extend(
            sweep(
                "backpressure",
                protocols or PROTOCOLS,
                (p.backpressure_interval,),
                keys=p.keys,
                parallelism=p.parallelism,
                records=p.backpressure_records,
                scenario=scenario_name(kind, p.slow_ms_per_batch),
            )
        )
    return out


def plot(summaries: list[Summary], _timelines: Timelines, outdir: Path) -> list[Path]:
    plt = plots.pyplot()
    mine = [s for s in summaries if s.cell.experiment == "backpressure" and s.cell.interval_s]
    if not mine:
        return []
    metrics: list[tuple[str, Callable[[Summary], float]]] = [
        ("checkpoint ms (median)", lambda s: s.checkpoint_ms_median),
        ("max alignment ms", lambda s: s.alignment_ms_max),
        ("logged records (max)", lambda s: float(s.logged_records_max)),
    ]
    scenarios = sorted({s.cell.scenario for s in mine})
    protocols = [p for p in PROTOCOLS if any(s.cell.protocol == p for s in mine)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(12, 4), squeeze=False)
    width = 0.8 / max(len(protocols), 1)
    for ax, (title, value) in zip(axes[0], metrics, strict=True):
        for i, proto in enumerate(protocols):
            ys = []
            for sc in scenarios:
                hit = [s for s in mine if s.cell.scenario == sc and s.cell.protocol == proto]
                ys.append(value(hit[0]) if hit else 0.0)
            xs = [k + i * width for k in range(len(scenarios))]
            ax.bar(xs, ys, width, label=proto, color=plots.COLORS.get(proto, "tab:cyan"))
        ax.set_xticks([k + width * (len(protocols) - 1) / 2 for k in range(len(scenarios))])
        ax.set_xticklabels(scenarios, fontsize=8)
        ax.set_title(title, fontsize=10)
    axes[0, 0].legend(fontsize=8)
    return [plots.save(fig, outdir / "backpressure.png")]


EXPERIMENT = Experiment(
    name="backpressure",
    number=4,
    title="Backpressure and skew",
    question="what do alignment and in-flight logging cost behind a slow operator and a hot key?",
    cells=cells,
    plot=plot,
    windowed=True,
)
