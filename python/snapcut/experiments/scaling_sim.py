"""Experiment 6: beyond this machine, by simulation.

The ABS paper ran its job on 5 to 40 nodes at a 3 s interval and saw both
ABS and the synchronous baseline scale linearly. This machine has one node,
so experiment 6 runs the same job in snapcut's timed discrete-event
simulator (`snapcut._core.simulate_scaling`, Rust): every node runs one task
of each stage, the three hash shuffles are all-to-all between the nodes,
and a cost model charges per-record work, the network, state captures and
writes, and the coordinator's handling of acknowledgements.

The cost model is **calibrated on this machine** from experiments 1 and 2
of the same run (or, when they were not run, from two short real jobs):
a node processes records at the rate `none` reached in experiment 1; a
stop-the-world checkpoint of experiment 2 gives the bytes per key and the
effective durable write rate. The commit cost comes from
bench/results/state/README.md; what cannot be measured here (the network between
nodes, the spread of a task's speed) is an assumption. The report names
every figure and where it came from.

Scaling is weak: each node's source emits the same number of records and
each node holds the same keys, so a perfectly scaling job takes the same
time on 5 or 1,000 nodes (the paper's fixed billion records would take
snapcut's per-node rate less than one 3 s interval on 40 nodes). The model
is checked against experiment 5 where they overlap: one node is this
machine at 2 tasks per operator.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from snapcut._core import simulate_scaling
from snapcut.experiments import plots
from snapcut.experiments.analysis import Row, Summary, row_of
from snapcut.experiments.base import Experiment, Timelines
from snapcut.experiments.grid import Cell, Preset, sweep
from snapcut.experiments.job import run_cell
from snapcut.experiments.measurement import Measurement

NAME = "scaling-sim"
MODEL_CHECK = "model-check"
PROTOCOLS = ("none", "aligned", "sync")
STAGES_WITH_STATE = 3
CHUNK_RECORDS = 65_536
"""Records per simulated work item (16 of the runtime's 4096-record batches):
the simulation's granularity, a few milliseconds of a task's time."""
BUFFER_RECORDS = 64 * 4096
"""What a receiver's input holds before its senders block: one of the
runtime's channels (64 batches of 4096 records)."""
OVERLAP_PARALLELISM = 2
"""Experiment 5's tasks per operator that one simulated node stands for
(this machine's 2 cores)."""

FIXED = {
    "net_latency_s": (100e-6, "assumed: one-way latency between nodes (a LAN)"),
    "net_bytes_per_s": (1.25e9, "assumed: 10 Gbit/s per node"),
    "record_bytes": (16.0, "assumed: a (user, dwell_ms) record on the wire"),
    "jitter": (0.2, "assumed: log-normal spread of a chunk's time (stragglers)"),
    "ack_s": (20e-6, "assumed: the coordinator's time per acknowledgement"),
    "background_slowdown": (
        0.3,
        "assumed: share of a task's speed lost while its background write runs",
    ),
    "commit_s": (
        5e-3,
        "bench/results/state/README.md: a small diff's write, fsync and manifest commit, 5-6 ms",
    ),
    "capture_s_per_key": (20e-9, "assumed: an Arrow column copy per key"),
}
"""Cost-model figures not calibrated in the run: what cannot be measured on
one machine (the network, stragglers) and what bench/results measured."""


@dataclass(frozen=True)
class Calibration:
    record_s: float
    state_bytes_per_key: float
    write_bytes_per_s: float
    source: str
    """Where the figures came from: this run's experiments or extra runs."""

    def cost(self, records_per_node: int) -> dict[str, float]:
        c: dict[str, float] = {k: v for k, (v, _) in FIXED.items()}
        c.update(
            record_s=self.record_s,
            state_bytes_per_key=self.state_bytes_per_key,
            write_bytes_per_s=self.write_bytes_per_s,
            chunk_records=float(chunk_records(records_per_node)),
        )
        c["buffer_records"] = float(max(BUFFER_RECORDS, 4 * c["chunk_records"]))
        return c


def chunk_records(records_per_node: int) -> int:
    """Records per work item; short runs still get a few hundred per task."""
    return max(1, min(CHUNK_RECORDS, records_per_node // 200))


_measured: dict[tuple[int, int], Calibration] = {}
"""Calibrations from extra real runs, by (keys, records) of the preset."""


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def calibrate_from_rows(rows: list[Row]) -> Calibration | None:
    """From experiments 1 and 2 of this run (their first round, so every
    simulated cell uses the same figures), or None if they are missing."""
    first = [r for r in rows if r.repetition == 0]
    none = [
        r.runtime_s / r.records
        for r in first
        if r.experiment == "interval" and r.protocol == "none"
    ]
    sync_rows = [
        r
        for r in first
        if r.protocol == "sync" and r.checkpoint_ms_median > 0 and r.state_bytes_max > 0
    ]
    # Experiment 2's (bigger states) if any took a periodic checkpoint, else 1's.
    sync = [r for r in sync_rows if r.experiment == "state-size"] or [
        r for r in sync_rows if r.experiment == "interval"
    ]
    record_s = _median(none)
    if record_s is None or not sync:
        return None
    return _calibration(record_s, sync, "experiments 1 and 2 of this run")


def _calibration(record_s: float, sync: list[Row], source: str) -> Calibration:
    biggest = max(r.keys for r in sync)
    big = [r for r in sync if r.keys == biggest]
    per_key = statistics.median(r.state_bytes_max / (STAGES_WITH_STATE * r.keys) for r in big)
    # Everything a stop-the-world checkpoint took, per byte: drain, capture,
    # write and commit. An upper bound on the write time (the simulator adds
    # its own drain and commit), so sync is not flattered.
    rate = statistics.median(r.state_bytes_max / (r.checkpoint_ms_median / 1e3) for r in big)
    return Calibration(record_s, per_key, rate, source)


def calibrate(rows: list[Row], preset: Preset, workdir: Path) -> Calibration:
    found = calibrate_from_rows(rows)
    if found is not None:
        return found
    key = (preset.keys, preset.state_records)
    if key not in _measured:
        _measured[key] = _measure(preset, workdir)
    return _measured[key]


def _measure(p: Preset, workdir: Path) -> Calibration:
    """Two short real jobs standing in for experiments 1 and 2."""
    records = 4_000_000
    # Big enough a state that its write is not all fixed cost, small enough
    # that a sync stall stays well inside the interval.
    keys = min(max(p.state_keys), 300_000)
    none = run_cell(Cell("calibration", "none", None, p.keys, 2, records), workdir)
    sync_cell = Cell("calibration", "sync", 0.05, keys, 2, records)
    sync = row_of(sync_cell, run_cell(sync_cell, workdir), repetition=0, order=0)
    if sync.checkpoints == 0:
        raise RuntimeError(
            f"calibrating experiment 6: {records:,} records gave no periodic checkpoint to "
            "measure; run experiments 1 and 2 in the same run (--experiments 1,2,6)"
        )
    return _calibration(
        none.runtime_s / records,
        [sync],
        "two short calibration runs (experiments 1 and 2 were not in this run)",
    )


def cells(p: Preset, protocols: tuple[str, ...] | None) -> list[Cell]:
    chosen = tuple(x for x in (protocols or PROTOCOLS) if x in PROTOCOLS)
    out: list[Cell] = []
    for nodes in p.sim_nodes:
        out.extend(
            sweep(
                NAME,
                chosen,
                (p.sim_interval,),
                keys=p.sim_keys_per_node,
                parallelism=nodes,
                records=p.sim_records_per_node * nodes,
            )
        )
    out.extend(
        sweep(
            NAME,
            chosen,
            (p.parallel_interval,),
            keys=p.keys,
            parallelism=1,
            records=p.parallel_records,
            scenario=MODEL_CHECK,
        )
    )
    return out


def simulate(cell: Cell, rows: list[Row], preset: Preset, workdir: Path) -> Measurement:
    """One simulated run of `cell` (`parallelism` = nodes, `keys` = keys per
    node); the repetition number is the seed, through `rows`' length."""
    cal = calibrate(rows, preset, workdir)
    nodes = cell.parallelism
    per_node = cell.records // nodes
    seed = sum(1 for r in rows if r.cell == cell)
    started = time.perf_counter()
    r = simulate_scaling(
        cell.protocol,
        nodes,
        per_node,
        cell.keys,
        cell.interval_s,
        seed=seed,
        cost=cal.cost(per_node),
    )
    wall = time.perf_counter() - started
    durations = r["checkpoint_s"]
    assert isinstance(durations, list)
    ckpt_ms = [1e3 * float(x) for x in durations]
    return Measurement(
        runtime_s=_number(r, "runtime_s"),
        wall_s=wall,
        throughput_rps=_number(r, "throughput_rps"),
        checkpoints=int(_number(r, "checkpoints")),
        checkpoint_ms_median=statistics.median(ckpt_ms) if ckpt_ms else 0.0,
        checkpoint_ms_max=max(ckpt_ms, default=0.0),
        state_bytes_max=int(_number(r, "state_bytes_max")),
        stall_s=_number(r, "max_pause_s"),
        alignment_ms_max=1e3 * _number(r, "alignment_max_s"),
        logged_records_max=0,
        bucket_s=0.0,
        source_timeline=[],
        last_stage_timeline=[],
        checkpoint_windows=[],
    )


def _number(report: dict[str, object], key: str) -> float:
    value = report[key]
    assert isinstance(value, int | float), f"{key}: {value!r}"
    return float(value)


def estimate_s(cell: Cell, _preset: Preset) -> float:
    """Seconds of real time to simulate `cell` (events grow with nodes;
    fitted to the full grid: 1,000 nodes ~16 s, 100 nodes ~1.4 s)."""
    chunks = cell.records / chunk_records(cell.records // cell.parallelism)
    return 0.05 + 2e-6 * chunks


@dataclass(frozen=True)
class Check:
    """One protocol of the model check: runtimes (medians) and overheads
    (paired with `none` of the same round / seed, medians)."""

    protocol: str
    measured_s: float
    simulated_s: float
    measured_overhead: float | None
    simulated_overhead: float | None

    @property
    def error(self) -> float:
        return self.simulated_s / self.measured_s - 1.0


def model_check(summaries: list[Summary]) -> list[Check]:
    """Where experiment 5 ran the configuration one simulated node stands for."""
    measured = {
        (s.cell.protocol, s.cell.interval_s, s.cell.keys, s.cell.records): s
        for s in summaries
        if s.cell.experiment == "parallelism" and s.cell.parallelism == OVERLAP_PARALLELISM
    }
    out = []
    for s in summaries:
        c = s.cell
        if c.experiment != NAME or c.scenario != MODEL_CHECK:
            continue
        m = measured.get((c.protocol, c.interval_s, c.keys, c.records))
        if m is not None:
            out.append(
                Check(
                    c.protocol,
                    m.runtime_median,
                    s.runtime_median,
                    m.overhead_median,
                    s.overhead_median,
                )
            )
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def notes(rows: list[Row], summaries: list[Summary]) -> str:
    """The report's extra text: the label, the cost model, the model check."""
    parts = [
        "**This is a simulation**, not a measurement: snapcut's timed discrete-event "
        "simulator runs the job on *n* simulated nodes (one task per stage each, the three "
        "shuffles all-to-all between nodes). In the table, *tasks/op* is the number of "
        "nodes and *keys* the keys each node holds; runtimes are simulated seconds. Weak "
        "scaling: every node's source emits the same records, so flat runtime = linear "
        "scaling. *longest stall* is the longest pause of a source (sync).\n",
    ]
    cal = calibrate_from_rows(rows) or next(iter(_measured.values()), None)
    if cal is not None:
        parts.append(f"Cost model (calibrated from {cal.source}):\n")
        parts.append("| parameter | value | from |\n|---|---|---|")
        parts.append(
            f"| record_s | {cal.record_s * 1e9:.1f} ns/record/stage "
            f"({1 / cal.record_s / 1e6:.1f} M records/s per node) | `none` runtime |"
        )
        parts.append(
            f"| state_bytes_per_key | {cal.state_bytes_per_key:.1f} B | largest sync "
            "checkpoint / (3 stages x keys) |"
        )
        parts.append(
            f"| write_bytes_per_s | {cal.write_bytes_per_s / 1e6:.0f} MB/s | that checkpoint's "
            "bytes / its whole duration (drain + capture + write + commit) |"
        )
        for k, (v, why) in FIXED.items():
            parts.append(f"| {k} | {v:g} | {why} |")
        parts.append(
            "| chunk_records, buffer_records | "
            f"{CHUNK_RECORDS:,}, {BUFFER_RECORDS:,} | the simulation's work item; one "
            "runtime channel (64 batches of 4096) per input |"
        )
        parts.append("")
    check = model_check(summaries)
    if check:
        parts.append(
            "Model check against experiment 5 (this machine, 2 tasks per operator = one "
            "simulated node; same records, keys and interval; the measured runs also take a "
            "final checkpoint at end of input, which the model leaves out):\n"
        )
        parts.append(
            "| protocol | measured runtime s | simulated runtime s | relative error "
            "| measured overhead | simulated overhead |\n|---|---|---|---|---|---|"
        )
        for row in check:
            parts.append(
                f"| {row.protocol} | {row.measured_s:.3f} | {row.simulated_s:.3f} "
                f"| {100 * row.error:+.1f} % | {_pct(row.measured_overhead)} "
                f"| {_pct(row.simulated_overhead)} |"
            )
        parts.append(
            "\nRuntimes carry this machine's run-to-run spread (two modes on a 2-vCPU guest); "
            "overheads are paired with `none` of the same round and cancel most of it.\n"
        )
    else:
        parts.append(
            "Model check: experiment 5 was not in this run (run it with "
            "`--experiments 5,6` to compare).\n"
        )
    return "\n".join(parts) + "\n"


def plot(summaries: list[Summary], _timelines: Timelines, outdir: Path) -> list[Path]:
    plt = plots.pyplot()
    mine = [s for s in summaries if s.cell.experiment == NAME and not s.cell.scenario]
    if not mine:
        return []
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    plots.lines(
        left,
        mine,
        lambda s: float(s.cell.parallelism),
        lambda s: (
            s.throughput_median / s.cell.parallelism / 1e6,
            s.cell.records / s.runtime_max / s.cell.parallelism / 1e6,
            s.cell.records / s.runtime_min / s.cell.parallelism / 1e6,
        ),
    )
    left.set_xscale("log")
    left.set_xlabel("nodes (simulated)")
    left.set_ylabel("M records/s per node, median, min-max")
    left.set_title("SIMULATION: throughput per node")
    left.legend()
    plots.lines(
        right,
        [s for s in mine if s.cell.protocol != "none"],
        lambda s: float(s.cell.parallelism),
        plots.overhead_pct,
    )
    right.axhline(0, color="black", linewidth=0.8)
    right.set_xscale("log")
    right.set_xlabel("nodes (simulated)")
    right.set_ylabel("overhead vs none, same seed (%)")
    right.set_title(f"SIMULATION: checkpoint every {mine[0].cell.interval_s or 0:g} s")
    right.legend()
    return [plots.save(fig, outdir / "scaling_sim.png")]


EXPERIMENT = Experiment(
    name=NAME,
    number=6,
    title="Beyond this machine, by simulation",
    question=(
        "do ABS and the synchronous baseline keep scaling from 5 to 40 nodes at a 3 s "
        "interval (the paper's figure), and what happens at 100 and 1,000 nodes?"
    ),
    cells=cells,
    plot=plot,
    simulate=simulate,
    notes=notes,
    estimate=estimate_s,
)
