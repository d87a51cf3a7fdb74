"""snapcut's checkpoint overhead from windows of one long run, checkpoints on and off.

interleaved.py pairs whole runs a few seconds apart, and still its medians
moved by 5-10 points from one window of the day to the next: on this guest
the job's speed without checkpoints changes by a third from one run to the
next. This script takes the pairing down to one second inside one run: the
job runs for about a minute with its protocol set and no periodic interval,
and a thread triggers a checkpoint every `--interval` (`JobControl.
trigger_checkpoint`, which queues behind an unfinished one as the periodic
trigger waits for it) during every other `--window` (on, off, on, off...).
Per window, the last keyed stage's records/s come from the runtime's own
50 ms timeline, skipping the window's first `--guard` seconds (the
checkpoint still finishing from the window before, and the first
alignment). An on window's overhead is (mean records/s of the off windows
either side) / (its records/s) - 1: a linear drift cancels. Also per
window: the process's CPU seconds per record and the machine's idle share,
to tell extra work from stalls.

With `--async-cpu N` the run is split: once the job's threads exist, the
tasks are pinned to the other CPUs and the store's writer and the
coordinator to CPU N, so the asynchronous phase of a checkpoint (encoding,
writing, committing, retention) no longer takes CPU from the job. What is
left is the overhead the tasks themselves pay (barriers, alignment, state
capture, logging), against a job running on one CPU fewer.

    python bench/peers/windowed.py --out bench/results/windowed/<run>
    python bench/peers/windowed.py --jobs three-shuffle --keys 100000 --modes aligned --seconds 90
    python bench/peers/windowed.py --jobs three-shuffle --keys 100000 --async-cpu 1
    python bench/peers/windowed.py --regenerate --out bench/results/windowed/<run>

Writes windowed.json (every window) and windowed.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import interleaved  # noqa: E402
import run as peers  # noqa: E402
import snapcut_job  # noqa: E402

from snapcut.experiments.windowed import (  # noqa: E402
    ROLES,
    Trigger,
    clustered_median_ci,
    cpu_shift,
    machine_counters,
    on_differences,
    on_overheads,
    pin_threads,
    thread_role,
    window_counters,
    window_rates,
)

__all__ = [
    "ROLES",
    "machine_counters",
    "on_differences",
    "pin_threads",
    "thread_role",
]

#: The keyed stage whose input the overhead is read from, per job.
MEASURED_STAGE = {"dwell": "aggregate", "three-shuffle": "stage3"}
WARMUP_S = 1.0
"""Time before the first window: threads start, every key is first inserted."""


def calibrate(job: str, keys: int, channel_capacity: int | None) -> float:
    """Records/s of a short run without checkpoints: sizes the measured run
    (and warms the process up)."""
    from snapcut import Checkpointing

    records = int(1.5 * peers.RATE[("snapcut", job)])
    flow = snapcut_job.build_flow(job, keys, records, 2, channel_capacity)
    report = flow.run(Checkpointing(protocol="none"))
    return records / report.duration_s


def measure(
    job: str, keys: int, mode: str, seconds: float, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """One long run of a cell, checkpoints on in every other window."""
    from snapcut import Checkpointing
    from snapcut.dataflow import JobControl

    # Flink's aligned-checkpoint timeout: unaligned checkpoints start aligned.
    timeout = args.alignment_timeout if mode == "unaligned" else 0.0
    # Sized unpinned: pinned to one CPU fewer, the run lasts as long or longer.
    records = int(seconds * calibrate(job, keys, args.channel_capacity))
    flow = snapcut_job.build_flow(job, keys, records, 2, args.channel_capacity)
    control = JobControl()
    trigger = Trigger(control, args.window, args.guard, args.interval, WARMUP_S, args.async_cpu)
    chk_dir = work / "checkpoints"
    where = None if args.store == "memory" else chk_dir
    trigger.start()
    try:
        report = flow.run(
            Checkpointing(protocol=mode, interval=None, alignment_timeout=timeout),
            checkpoint_dir=where,
            fsync=snapcut_job.FSYNC_OF_STORE[args.store],
            control=control,
        )
    finally:
        trigger.stop.set()
        trigger.join()
        shutil.rmtree(chk_dir, ignore_errors=True)
    stats = snapcut_job.checked_stats(report, records)
    rates = window_rates(
        report.timeline[MEASURED_STAGE[job]],
        report.timeline_bucket_s,
        args.window,
        args.guard,
        WARMUP_S,
    )
    windows = window_counters(trigger.marks, len(rates))
    measured = args.window - args.guard
    # Share of one CPU (1.0 = a whole core) per role, user and system apart.
    thread_share = {
        f"{role} {kind}": [w.roles.get(role, [0.0, 0.0])[i] / measured for w in windows]
        for role in ROLES
        for i, kind in enumerate(("user", "system"))
    } | {"outside": [w.outside_s / measured for w in windows]}
    # 0 for a window without records: on_overheads skips it, and the windows keep their parity.
    cpu_per_m = [
        w.cpu_s / (r * measured) * 1e6 if r > 0 else 0.0
        for w, r in zip(windows, rates, strict=False)
    ]
    periodic = [c for c in report.completed_checkpoints if not c.is_final]
    return {
        "job": job,
        "keys": keys,
        "mode": mode,
        "protocol": protocol_label(mode, timeout),
        "records": records,
        "seconds": report.duration_s,
        "rates": rates,
        "cpu_s_per_m_records": cpu_per_m,
        "idle_share": [w.idle for w in windows],
        "thread_cpu_share": thread_share,
        "triggered": trigger.triggered,
        "pinned": trigger.pinned,
        "checkpoints": stats["checkpoints"],
        "checkpoint_ms": stats["checkpoint_ms"],
        "alignment_ms": stats["alignment_ms"],
        "logged_records": statistics.median(c.logged_records for c in periodic)
        if periodic
        else None,
    }


def protocol_label(mode: str, alignment_timeout: float) -> str:
    """The protocol as the report names it: "unaligned, aligned first for 20 ms"."""
    if alignment_timeout > 0:
        return f"{mode}, aligned first for {alignment_timeout * 1e3:g} ms"
    return mode


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell (all its runs' on windows together)."""
    cells: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in runs:
        # Runs recorded before the alignment timeout was a setting have no "protocol".
        cells.setdefault((r["job"], r["keys"], r.get("protocol", r["mode"])), []).append(r)
    rows = []
    for (job, keys, mode), rs in cells.items():
        per_run = [on_overheads(r["rates"]) for r in rs]
        wall = [o for g in per_run for o in g]
        cpu = [o for r in rs for o in on_overheads(r["cpu_s_per_m_records"], False)]
        idle_on = [v for r in rs for v in r["idle_share"][1::2]]
        idle_off = [v for r in rs for v in r["idle_share"][0::2]]
        off_rates = [v for r in rs for v in r["rates"][0::2]]
        on_rates = [v for r in rs for v in r["rates"][1::2]]
        row: dict[str, Any] = {"job": job, "keys": keys, "mode": mode, "windows": len(wall)}
        if wall:
            lo, hi = clustered_median_ci(per_run)
            mid = statistics.median(wall)
            row |= {
                "overhead": mid,
                "overhead_ci": [lo, hi],
                "overhead_mean": statistics.mean(wall),
                "overhead_by_run": [statistics.median(g) for g in per_run if g],
                "overhead_of_means": statistics.mean(off_rates) / statistics.mean(on_rates) - 1,
                "cpu_overhead": statistics.median(cpu) if cpu else None,
                "idle_on": statistics.mean(idle_on) if idle_on else None,
                "idle_off": statistics.mean(idle_off) if idle_off else None,
                "baseline_rps": statistics.median(off_rates),
                "checkpoints": sum(r["checkpoints"] for r in rs),
                "checkpoint_ms": peers._median(r["checkpoint_ms"] for r in rs),
                "alignment_ms": peers._median(r["alignment_ms"] for r in rs),
                "logged_records": peers._median(r["logged_records"] for r in rs),
                "verdict": interleaved.verdict(lo, mid, hi),
                "cpu_shift": cpu_shift(rs),
            }
        rows.append(row)
    return rows


def capacity(batches: int | None) -> str:
    return (
        "channels of the default capacity" if batches is None else f"channels of {batches} batches"
    )


def pinning(async_cpu: int | None) -> str:
    if async_cpu is None:
        return "threads not pinned"
    return (
        f"tasks pinned to every CPU but {async_cpu}, the store's writer and the coordinator "
        f"to CPU {async_cpu}, once warmed up"
    )


def report(data: dict[str, Any]) -> str:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:+.1%}"

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        "# snapcut's checkpoint overhead every 100 ms, from on and off windows of one run",
        "",
        data["machine_md"],
        "",
        f"Command: `{data['command']}`  ",
        f"Per cell: {data['runs_per_cell']} run(s) of about {data['seconds']:.0f} s; windows "
        f"of {data['window_s']:g} s alternating off and on (a checkpoint every "
        f"{data['interval_s'] * 1e3:.0f} ms in on windows), each measured after its first "
        f"{data['guard_s']:g} s; store: {data['store']}; "
        f"{capacity(data.get('channel_capacity'))}; {pinning(data.get('async_cpu'))}; "
        "wall time "
        f"{data['wall_s'] / 60:.1f} min. Overhead of an on window: (mean records/s of the off "
        "windows either side) / (its records/s) - 1, at the last keyed stage's input; the "
        "table gives the median over on windows, its bootstrap 95 % interval (resampling "
        "runs, then windows within them), each run's median, the mean, and the ratio of the "
        "mean off and on records/s. CPU: the same for the process's CPU "
        "seconds per record. Idle: the machine's idle share in on / off windows. The target "
        "(issue 10): at most +10 %.",
        "",
        "| job | keys | protocol | on windows | overhead | 95 % interval | by run | mean "
        "| of means "
        "| CPU per record | idle on / off | off | checkpoints | checkpoint ms | alignment ms "
        "| logged records | target ≤ 10 % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["summary"]:
        if "overhead" not in r:
            lines.append(f"| {r['job']} | {r['keys']:,} | {r['mode']} | 0 | - ||||||||||||| |")
            continue
        lo, hi = r["overhead_ci"]
        idle = "-" if r["idle_on"] is None else f"{r['idle_on']:.1%} / {r['idle_off']:.1%}"
        lines.append(
            f"| {r['job']} | {r['keys']:,} | {r['mode']} | {r['windows']} | "
            f"**{pct(r['overhead'])}** | [{pct(lo)}, {pct(hi)}] | "
            f"{', '.join(f'{v:+.1%}' for v in r.get('overhead_by_run', []))} | "
            f"{pct(r['overhead_mean'])} | "
            f"{pct(r['overhead_of_means'])} | {pct(r['cpu_overhead'])} | {idle} | "
            f"{r['baseline_rps'] / 1e6:.1f} M/s | {r['checkpoints']} | "
            f"{num(r['checkpoint_ms'], '.1f')} | {num(r['alignment_ms'], '.2f')} | "
            f"{num(r['logged_records'], ',.0f')} | {r['verdict']} |"
        )
    shifts = [r for r in data["summary"] if r.get("cpu_shift")]
    if shifts:
        lines += [
            "",
            "## Where the CPU goes in on windows",
            "",
            "Per thread role, the share of one CPU it used in an on window beyond the mean of "
            "the off windows either side (mean over on windows; +1.0 points = 1 % of one "
            "core; the machine above has its CPUs busy in every window). The "
            "writer encodes and writes the snapshot files, the coordinator commits (manifest, "
            "fsync, retention), the tasks run the job and capture their state; what the "
            "writer and the coordinator take, the tasks lose, and CPU per record (above) says "
            "whether the tasks' own work per record grew as well. Outside the process: the "
            "machine's busy CPU that was not this process's (the kernel's write-back "
            "threads, interrupts, other programs).",
            "",
            "| job | keys | protocol | writer user | writer kernel | coordinator user "
            "| coordinator kernel | tasks user | tasks kernel | other | outside the process |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in shifts:
            c = r["cpu_shift"]
            cells = [
                f"{c[k] * 100:+.1f}" if k in c else "-"
                for k in (
                    "writer user",
                    "writer system",
                    "coordinator user",
                    "coordinator system",
                    "tasks user",
                    "tasks system",
                )
            ]
            other = sum(c.get(f"other {k}", 0.0) for k in ("user", "system"))
            outside = f"{c['outside'] * 100:+.1f}" if "outside" in c else "-"
            lines.append(
                f"| {r['job']} | {r['keys']:,} | {r['mode']} | {' | '.join(cells)} "
                f"| {other * 100:+.1f} | {outside} |"
            )
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    interleaved.add_cell_arguments(p)
    p.add_argument("--window", type=float, default=1.0, help="window length, seconds")
    p.add_argument("--guard", type=float, default=0.2, help="unmeasured start of a window, s")
    p.add_argument("--seconds", type=float, default=60.0, help="about how long a run lasts")
    p.add_argument("--runs", type=int, default=1, help="runs per cell")
    p.add_argument(
        "--alignment-timeout",
        type=float,
        default=0.0,
        help="seconds; unaligned checkpoints start aligned and switch after this long "
        "(Checkpointing(alignment_timeout=...), Flink's aligned-checkpoint timeout); "
        "0: unaligned from the start",
    )
    p.add_argument(
        "--channel-capacity",
        type=int,
        default=None,
        help="batches per channel (Dataflow(channel_capacity=...)); default: the runtime's",
    )
    p.add_argument(
        "--async-cpu",
        type=int,
        default=None,
        help="CPU for the store's writer and the coordinator alone; the tasks get the others",
    )
    interleaved.add_output_arguments(p, "windowed")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    if args.alignment_timeout < 0:
        p.error("--alignment-timeout must be at least 0 (0: unaligned from the start)")
    if args.channel_capacity is not None and args.channel_capacity < 1:
        p.error("--channel-capacity must be at least 1")
    if args.async_cpu is not None:
        usable = sorted(os.sched_getaffinity(0))
        if args.async_cpu not in usable:
            p.error(f"--async-cpu {args.async_cpu} is not a CPU this process may use: {usable}")
        if len(usable) < 2:
            p.error("--async-cpu needs at least two usable CPUs: the tasks keep the others")
    if not 0 <= args.guard < args.window:
        p.error("--guard must be at least 0 and shorter than --window")
    if args.interval <= 0 or args.interval > args.window:
        p.error("--interval must be positive and at most --window")
    if args.seconds < WARMUP_S + 4 * args.window:
        p.error(f"--seconds must be at least {WARMUP_S + 4 * args.window:g} (four windows)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.regenerate:
        return interleaved.regenerate(args.out, "windowed", summarize, report)
    from snapcut.experiments.machine import Machine

    args.out.mkdir(parents=True, exist_ok=True)
    machine = Machine()
    started = time.time()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="windowed-") as tmp:
        for job in args.jobs:
            for keys in args.keys:
                for mode in args.modes:
                    for _ in range(args.runs):
                        r = measure(job, keys, mode, args.seconds, args, Path(tmp))
                        runs.append(r)
                        ohs = on_overheads(r["rates"])
                        mid = statistics.median(ohs) if ohs else float("nan")
                        print(
                            f"{job} {keys:,} {mode}: {len(ohs)} on windows, "
                            f"median overhead {mid:+.1%}",
                            flush=True,
                        )
    machine.finish()
    data = {
        "command": " ".join(["python", *sys.argv]),
        "wall_s": time.time() - started,
        "machine_md": machine.markdown(),
        "runs_per_cell": args.runs,
        "seconds": args.seconds,
        "window_s": args.window,
        "guard_s": args.guard,
        "interval_s": args.interval,
        "store": args.store,
        "channel_capacity": args.channel_capacity,
        "alignment_timeout_s": args.alignment_timeout,
        "async_cpu": args.async_cpu,
        "runs": runs,
        "summary": summarize(runs),
    }
    return interleaved.write_results(args.out, "windowed", data, report)


if __name__ == "__main__":
    raise SystemExit(main())
