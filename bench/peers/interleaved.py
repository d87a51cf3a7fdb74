"""snapcut's checkpoint overhead from short runs interleaved in one process.

run.py and store_cost.py start a fresh process for each run (jobs of about
10 s) and pair each checkpointed run with its round's run without
checkpoints. On a guest whose speed changes from one minute to the next,
such a pair often straddles a change: in their records the overhead of a
round grows with its baseline's speed, and the same cell's 10-round median
moved by 8-15 points between runs. This script runs both sides of a pair in
one process, a few seconds each, in ABBA order (off, on, on, off, off, on,
...) so that a pair is seconds apart and a steady drift cancels. The
overhead is the median over pairs of (records/s without checkpoints) /
(records/s with them) - 1, with a bootstrap 95 % confidence interval for
that median, in wall time (the runtime's own clock, `RunReport.duration_s`)
and in CPU time of the process.

    python bench/peers/interleaved.py --pairs 16 --out bench/results/interleaved/<run>
    python bench/peers/interleaved.py --jobs three-shuffle --keys 100000 --modes aligned
    python bench/peers/interleaved.py --regenerate --out bench/results/interleaved/<run>

Writes interleaved.json (every run) and interleaved.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as peers  # noqa: E402
import snapcut_job  # noqa: E402

from snapcut.experiments.windowed import bootstrap_median_ci  # noqa: E402

MODES = ("aligned", "unaligned")
TARGET = 0.10
"""Issue 10's target for snapcut's overhead with checkpoints every 100 ms."""


def abba(pairs: int) -> list[tuple[int, bool]]:
    """(pair, checkpointed) in run order: off, on, on, off, off, on, ..."""
    order: list[tuple[int, bool]] = []
    for i in range(pairs):
        sides = (False, True) if i % 2 == 0 else (True, False)
        order += [(i, on) for on in sides]
    return order


def verdict(lo: float, mid: float, hi: float, target: float = TARGET) -> str:
    if hi <= target:
        return f"met (the whole interval ≤ {target:.0%})"
    if lo > target:
        return f"missed (the whole interval > {target:.0%})"
    side = "met" if mid <= target else "missed"
    return f"{side} at the median; the interval spans {target:.0%}"


def overhead(pair: dict[bool, dict[str, Any]]) -> float:
    """(records/s off) / (records/s on) - 1; both sides ran the same records."""
    return float(pair[True]["seconds"] / pair[False]["seconds"] - 1)


def halves(pairs: list[dict[bool, dict[str, Any]]]) -> dict[str, float | None]:
    """Median overhead of the slower and of the faster half of the pairs, by
    the baseline's records/s: the guest's two speeds, reported apart (an odd
    middle pair goes to neither)."""
    by_speed = sorted(pairs, key=lambda p: p[False]["records"] / p[False]["seconds"])
    half = len(by_speed) // 2

    def median(ps: list[dict[bool, dict[str, Any]]]) -> float | None:
        return statistics.median(map(overhead, ps)) if ps else None

    return {
        "overhead_slow_half": median(by_speed[:half]),
        "overhead_fast_half": median(by_speed[len(by_speed) - half :]),
    }


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell: the pairs' overheads in wall and CPU time."""
    cells: dict[tuple[str, int, str], dict[int, dict[bool, dict[str, Any]]]] = {}
    for r in runs:
        cell = cells.setdefault((r["job"], r["keys"], r["mode"]), {})
        cell.setdefault(r["pair"], {})[r["checkpointed"]] = r
    rows = []
    for (job, keys, mode), pairs in cells.items():
        full = [p for p in pairs.values() if len(p) == 2]
        wall = [overhead(p) for p in full]
        cpu = [p[True]["cpu_s"] / p[False]["cpu_s"] - 1 for p in full]
        on = [p[True] for p in full]
        row: dict[str, Any] = {"job": job, "keys": keys, "mode": mode, "pairs": len(full)}
        if wall:
            lo, hi = bootstrap_median_ci(wall)
            mid = statistics.median(wall)
            row |= {
                "overhead": mid,
                "overhead_ci": [lo, hi],
                "overhead_range": [min(wall), max(wall)],
                "cpu_overhead": statistics.median(cpu),
                "cpu_overhead_ci": list(bootstrap_median_ci(cpu)),
                "baseline_rps": statistics.median(
                    p[False]["records"] / p[False]["seconds"] for p in full
                ),
                **halves(full),
                "checkpoints": statistics.median(r["checkpoints"] for r in on),
                "checkpoint_ms": peers._median(r["checkpoint_ms"] for r in on),
                "alignment_ms": peers._median(r["alignment_ms"] for r in on),
                "verdict": verdict(lo, mid, hi),
            }
        rows.append(row)
    return rows


def measure(
    job: str,
    keys: int,
    records: int,
    mode: str,
    interval_s: float,
    store: str,
    work: Path,
    checkpointed: bool,
) -> dict[str, Any]:
    """One run in this process, with `mode` checkpoints or without any."""
    from snapcut import Checkpointing

    flow = snapcut_job.build_flow(job, keys, records, parallelism=2)
    chk_dir = work / "checkpoints"
    if not checkpointed:
        cp, where = Checkpointing(protocol="none"), None
    else:
        cp = Checkpointing(protocol=mode, interval=interval_s)
        where = None if store == "memory" else chk_dir
    cpu0 = time.process_time()
    report = flow.run(cp, checkpoint_dir=where, fsync=snapcut_job.FSYNC_OF_STORE[store])
    cpu = time.process_time() - cpu0
    shutil.rmtree(chk_dir, ignore_errors=True)
    return {
        "records": records,
        "seconds": report.duration_s,
        "cpu_s": cpu,
        **snapcut_job.checked_stats(report, records),
    }


def run_cell(
    job: str,
    keys: int,
    mode: str,
    pairs: int,
    records: int,
    measure_one: Callable[[bool], dict[str, Any]],
) -> list[dict[str, Any]]:
    """A warm-up of each side, then `pairs` pairs in ABBA order."""
    measure_one(False)
    measure_one(True)
    out = []
    for pair, on in abba(pairs):
        res = measure_one(on)
        out.append(
            {"job": job, "keys": keys, "mode": mode, "pair": pair, "checkpointed": on, **res}
        )
        rate = records / res["seconds"] / 1e6
        side = mode if on else "off"
        print(f"{job} {keys:,} pair {pair} {side}: {rate:.1f} M/s", flush=True)
    return out


def report(data: dict[str, Any]) -> str:
    def pct(v: float) -> str:
        return f"{v:+.1%}"

    def opt(v: float | None) -> str:
        return "-" if v is None else pct(v)

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        "# snapcut's checkpoint overhead every 100 ms, from short runs interleaved in one process",
        "",
        data["machine_md"],
        "",
        f"Command: `{data['command']}`  ",
        f"Pairs per cell: {data['pairs']} in ABBA order after one warm-up run of each side; "
        f"store: {data['store']}; records per run: x{data['records_scale']} of run.py's; wall "
        f"time {data['wall_s'] / 60:.1f} min. Overhead per pair: (records/s off) / "
        "(records/s with checkpoints) - 1; the table gives the median over pairs, its "
        "bootstrap 95 % interval, the range, and the medians of the half of the pairs whose "
        "baseline ran slower and of the half whose baseline ran faster. The target (issue 10): "
        "at most +10 %.",
        "",
        "| job | keys | protocol | pairs | wall overhead | 95 % interval | range "
        "| slower / faster half | CPU overhead | off | checkpoints a run | checkpoint ms "
        "| alignment ms | target ≤ 10 % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["summary"]:
        if "overhead" not in r:
            lines.append(f"| {r['job']} | {r['keys']:,} | {r['mode']} | 0 | - ||||||||| no pairs |")
            continue
        lo, hi = r["overhead_ci"]
        a, b = r["overhead_range"]
        lines.append(
            f"| {r['job']} | {r['keys']:,} | {r['mode']} | {r['pairs']} | "
            f"**{pct(r['overhead'])}** | [{pct(lo)}, {pct(hi)}] | [{a:+.0%}, {b:+.0%}] | "
            f"{opt(r['overhead_slow_half'])} / {opt(r['overhead_fast_half'])} | "
            f"{pct(r['cpu_overhead'])} | {r['baseline_rps'] / 1e6:.1f} M/s | "
            f"{r['checkpoints']:.0f} | {num(r['checkpoint_ms'], '.1f')} | "
            f"{num(r['alignment_ms'], '.2f')} | "
            f"{r['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def add_cell_arguments(p: argparse.ArgumentParser) -> None:
    """The cells to measure (jobs x keys x protocols), the store and the interval."""
    p.add_argument("--jobs", nargs="+", choices=peers.JOBS, default=list(peers.JOBS))
    p.add_argument("--keys", nargs="+", type=int, default=list(peers.KEYS))
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--store", choices=tuple(snapcut_job.FSYNC_OF_STORE), default="disk")
    p.add_argument("--interval", type=float, default=0.1, help="checkpoint interval, seconds")


def add_output_arguments(p: argparse.ArgumentParser, stem: str) -> None:
    """--out and --regenerate, for a script writing <stem>.json and <stem>.md."""
    p.add_argument("--out", type=Path, default=peers.REPO / "bench" / "out" / stem)
    p.add_argument(
        "--regenerate",
        action="store_true",
        help=f"measure nothing: summarize --out's {stem}.json again and rewrite its report",
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=16)
    add_cell_arguments(p)
    p.add_argument(
        "--records-scale",
        type=float,
        default=0.4,
        help="x run.py's record counts (0.4: runs of 2-4 s on 2 cores)",
    )
    add_output_arguments(p, "interleaved")
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error("--pairs must be at least 1")
    return args


def regenerate(
    out: Path,
    stem: str,
    summarize_runs: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
    write_report: Callable[[dict[str, Any]], str],
) -> int:
    """--regenerate: summarize out/<stem>.json's runs again and rewrite it and out/<stem>.md."""
    path = out / f"{stem}.json"
    if not path.is_file():
        raise SystemExit(f"--regenerate: no {path}; run without --regenerate first")
    data = json.loads(path.read_text())
    data["summary"] = summarize_runs(data["runs"])
    return write_results(out, stem, data, write_report)


def write_results(
    out: Path, stem: str, data: dict[str, Any], write_report: Callable[[dict[str, Any]], str]
) -> int:
    """Writes out/<stem>.json (every run and the summary) and its report out/<stem>.md."""
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1))
    (out / f"{stem}.md").write_text(write_report(data))
    print(f"wrote {out / f'{stem}.md'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.regenerate:
        return regenerate(args.out, "interleaved", summarize, report)
    from snapcut.experiments.machine import Machine

    args.out.mkdir(parents=True, exist_ok=True)
    machine = Machine()
    started = time.time()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="interleaved-") as tmp:
        for job in args.jobs:
            for keys in args.keys:
                records = int(peers.RECORDS[("snapcut", job)][0] * args.records_scale)
                for mode in args.modes:
                    one = functools.partial(
                        measure, job, keys, records, mode, args.interval, args.store, Path(tmp)
                    )
                    runs += run_cell(job, keys, mode, args.pairs, records, one)
    machine.finish()
    data = {
        "command": " ".join(["python", *sys.argv]),
        "wall_s": time.time() - started,
        "machine_md": machine.markdown(),
        "pairs": args.pairs,
        "store": args.store,
        "records_scale": args.records_scale,
        "interval_s": args.interval,
        "runs": runs,
        "summary": summarize(runs),
    }
    return write_results(args.out, "interleaved", data, report)


if __name__ == "__main__":
    raise SystemExit(main())
