"""results.csv, timeline.csv and report.md (tables, machine, plots) of a run."""

from __future__ import annotations

import csv
from pathlib import Path

from snapcut.experiments.analysis import Summary, write_csv
from snapcut.experiments.base import Experiment, Timelines
from snapcut.experiments.effects import write_effects_csv, write_windows_csv
from snapcut.experiments.effects_report import HOW_TO_READ, effects_table, trends_text, widest
from snapcut.experiments.grid import Preset
from snapcut.experiments.machine import Machine
from snapcut.experiments.runner import BUDGET_FACTOR, BUDGET_FLOOR_S, Outcome
from snapcut.experiments.spark_writes import write_batches_csv

PROTOCOLS = (
    ("none", "nothing (the baseline)"),
    (
        "aligned",
        "ABS: sources inject barriers; a task blocks the inputs that delivered barrier n "
        "until all have, captures the keys changed since the last checkpoint, forwards the "
        "barrier and goes on; the store writes the capture in the background",
    ),
    (
        "unaligned",
        "barriers overtake queued data: a task captures at once and logs the records it "
        "overtook; background write",
    ),
    (
        "chandy-lamport",
        "markers: state captured at the first marker, other input channels recorded until "
        "their markers arrive; background write",
    ),
    (
        "sync-capture",
        "sources pause, channels drain, tasks capture (incrementally); sources resume once "
        "every task has captured, the store writes in the background",
    ),
    (
        "sync",
        "stop the world (Naiad): sources pause, channels drain, every task's **full** state "
        "is written and fsynced and the manifest committed; only then do sources resume",
    ),
)
PROTOCOLS_TEXT = (
    "| protocol | what happens at a checkpoint |\n|---|---|\n"
    + "\n".join(f"| {p} | {what} |" for p, what in PROTOCOLS)
    + "\n"
)


def write_timelines(timelines: Timelines, path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "experiment",
                "protocol",
                "interval_s",
                "keys",
                "parallelism",
                "records",
                "t_s",
                "source_records",
                "last_stage_records",
            ]
        )
        for cell, m in sorted(timelines.items()):
            n = max(len(m.source_timeline), len(m.last_stage_timeline))
            for i in range(n):
                src = m.source_timeline[i] if i < len(m.source_timeline) else 0
                last = m.last_stage_timeline[i] if i < len(m.last_stage_timeline) else 0
                w.writerow(
                    [
                        cell.experiment,
                        cell.protocol,
                        "" if cell.interval_s is None else cell.interval_s,
                        cell.keys,
                        cell.parallelism,
                        cell.records,
                        round(i * m.bucket_s, 6),
                        src,
                        last,
                    ]
                )


def _range(med: float, lo: float, hi: float, fmt: str) -> str:
    return f"{med:{fmt}} [{lo:{fmt}}-{hi:{fmt}}]"


def table(summaries: list[Summary]) -> str:
    head = (
        "| protocol | interval | keys | tasks/op | runs | runtime s, median [min-max] "
        "| overhead %, median [min-max] | M rec/s | checkpoints | ckpt ms median / max "
        "| max align ms | logged rec | longest stall s | state MiB |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for s in summaries:
        c = s.cell
        ovh = (
            "-"
            if s.overhead_median is None or c.protocol == "none"
            else _range(
                100 * s.overhead_median,
                100 * (s.overhead_min or 0),
                100 * (s.overhead_max or 0),
                "+.1f",
            )
        )
        proto = f"{c.protocol} ({c.scenario})" if c.scenario else c.protocol
        runs, projected = str(s.runs), ""
        if s.stopped:
            runs += f" ({s.stopped} stopped, >= {100 * s.completed_min:.2f} % done)"
            projected = "projected "
        lines.append(
            f"| {proto} | {'-' if c.interval_s is None else f'{c.interval_s:g} s'} "
            f"| {c.keys:,} | {c.parallelism} | {runs} "
            f"| {projected}{_range(s.runtime_median, s.runtime_min, s.runtime_max, '.3f')} "
            f"| {ovh} "
            f"| {s.throughput_median / 1e6:.2f} | {s.checkpoints_median:g} "
            f"| {s.checkpoint_ms_median:.1f} / {s.checkpoint_ms_max:.1f} "
            f"| {s.alignment_ms_max:.1f} | {s.logged_records_max:,} "
            f"| {s.stall_s_max:.2f} | {s.state_bytes_max / 2**20:.1f} |"
        )
    return head + "\n".join(lines) + "\n"


def markdown(
    outcome: Outcome,
    experiments: list[Experiment],
    preset: Preset,
    machine: Machine,
    command: str,
    plots: dict[str, list[Path]],
) -> str:
    label = (
        "**smoke run** — small grid; figures show the harness works, not results"
        if preset.smoke
        else "full grid"
    )
    parts = [
        f"# snapcut experiments — preset `{preset.name}` ({label})\n",
        f"Command: `{command}`\n",
        "## Machine\n",
        machine.markdown() + "\n",
        "## How to read this\n",
        f"Each cell ran {max((s.runs for s in outcome.summaries), default=0)} times; round r "
        "runs every cell once, in an order rotated by r. *runtime* is the job's own elapsed "
        "time (the Rust runtime's clock, from start to the last task's end, durable "
        "checkpoints included; every protocol but `none` also takes a final checkpoint at "
        "end of input, which short runs feel). *checkpoints* counts the periodic ones. "
        "*overhead* is runtime / runtime of `none` in the same round "
        "and group (same experiment, keys, tasks, records) - 1, computed per round; the table "
        "gives the median and [min-max] over rounds. *longest stall*: the longest run of empty "
        "50 ms buckets at the source. *stopped*: a run with checkpoints is cancelled once it "
        f"has taken {BUDGET_FACTOR:g}x the estimate of its job without checkpoints (at least "
        f"{BUDGET_FLOOR_S:g} s); its runtime is then projected from the records its sources "
        "had emitted by its last committed checkpoint (elapsed x records / records done; "
        "`completed` in results.csv), and its other columns describe that last checkpoint "
        "(*checkpoints*: the last one's id). Raw data: `results.csv` (one line per run), "
        "`timeline.csv` (records per bucket).\n",
        'What each protocol does at a checkpoint (README, "Protocols"):\n',
        PROTOCOLS_TEXT,
        HOW_TO_READ if outcome.effects else "",
    ]
    for e in experiments:
        mine = [s for s in outcome.summaries if s.cell.experiment == e.name]
        parts.append(f"## {e.number}. {e.title}\n")
        parts.append(f"Question: {e.question}\n")
        if e.notes is not None:
            parts.append(e.notes(outcome.rows, outcome.summaries))
        parts.append(table(mine) if mine else "(no runs)\n")
        effects = [x for x in outcome.effects if x.cell.experiment == e.name]
        unmeasured = [c for c in outcome.unmeasured if c.experiment == e.name]
        if effects or unmeasured:
            parts.append(f"### {e.number}. Overheads with 95 % intervals\n")
            parts.append(effects_table(effects, outcome.effects))
            parts.append(widest(effects))
            parts.append(trends_text(effects))
        if unmeasured:
            parts.append(
                "No effect (the windowed run ended before an on window had an off window "
                "either side): " + "; ".join(c.label() for c in unmeasured) + "\n"
            )
        for p in plots.get(e.name, []):
            parts.append(f"![{p.stem}]({p.name})\n")
    return "\n".join(parts)


def write_all(
    outcome: Outcome,
    experiments: list[Experiment],
    preset: Preset,
    machine: Machine,
    command: str,
    outdir: Path,
    *,
    make_plots: bool,
) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    write_csv(outcome.rows, outdir / "results.csv")
    write_timelines(outcome.timelines, outdir / "timeline.csv")
    write_windows_csv(outcome.windows, outdir / "windows.csv")
    write_effects_csv(outcome.effects, outdir / "effects.csv")
    names = ["results.csv", "timeline.csv", "windows.csv", "effects.csv"]
    if outcome.batches:
        write_batches_csv(outcome.batches, outdir / "batches.csv")
        names.append("batches.csv")
    plots: dict[str, list[Path]] = {}
    if make_plots:
        from snapcut.experiments.figure import paper_figure, state_figure

        with_intervals = {"interval": paper_figure, "state-size": state_figure}
        for e in experiments:
            plots[e.name] = e.plot(outcome.summaries, outcome.timelines, outdir)
            if e.name in with_intervals:
                plots[e.name] = with_intervals[e.name](outcome.effects, outdir) + plots[e.name]
    report = outdir / "report.md"
    report.write_text(markdown(outcome, experiments, preset, machine, command, plots))
    files = [outdir / n for n in names]
    files.append(report)
    files.extend(p for ps in plots.values() for p in ps)
    return files
