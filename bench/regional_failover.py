"""What a failed sink costs the job's other sinks under each failover strategy.

One job, one injected failure, three strategies (`full`, `region`,
`upstream`), interleaved round by round: a fast source feeds a keyed
stateful stage (2 subtasks), which fans out to three sinks of 2 subtasks
each, every sink writing slowly (a sleep per batch: the sinks are the
bottleneck, as targets of a data-integration job usually are; each channel
holds 64 batches, so a sink has about 64 x `--sink-ms` of work queued).
Subtask 0 of the Arrow sink fails once, a third of the way in; restarts
wait `--restart-delay` (Flink's default is 1 s). Under `upstream` a healthy
sink stalls only once its queue runs dry before the restarted source is
back and has replayed (dropped quickly) up to where it stood.

Per run, from the run report (`RunReport.task_timeline`, 50 ms buckets, and
`RunReport.restarts`):

- recovery of the failed sink: from the failure to the first bucket in
  which the restarted subtask takes records again;
- the healthy sink subtasks' throughput while the failed one recovers, as a
  share of their throughput in the second before the failure;
- the healthy sink subtasks restarted, and the replayed records they
  dropped (recognised by channel sequence number: upstream).

Writes ``regional_failover.json`` (every run), ``README-table.md`` (medians
and spreads) and ``healthy_sinks.png`` (the healthy sinks' records per 50 ms
around the failure, one run per strategy) into ``--out``.

    python bench/regional_failover.py --rounds 5 --out bench/results/regional_failover
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from snapcut import Checkpointing, Dataflow, RunReport, TaskFailure
from snapcut.dataflow import dwell_events
from snapcut.jobs.local_dwell import throttle

STRATEGIES = ("full", "region", "upstream")
SINKS = ("arrow-sink", "idempotent-sink", "collect-memory")
FAILED = "arrow-sink-0"


def build(records: int, sink_ms: float, out: Path) -> Dataflow:
    flow = Dataflow(parallelism=2)
    table = dwell_events(200, records, 7)
    table = table.append_column("id", pa.array(range(records), type=pa.int64()))
    events = flow.from_batches(table.to_batches(max_chunksize=100), name="events", parallelism=1)
    stage = events.key_by("user").aggregate(name="stage", forward=True, seen="count")
    stage.map(throttle(sink_ms), name="arrow-slow").write_arrow(out / "arrow", name="arrow-sink")
    idem = out / "idempotent"
    idem.mkdir(parents=True, exist_ok=True)

    def upsert(batch: pa.RecordBatch) -> None:
        time.sleep(sink_ms / 1000)
        if batch.num_rows:
            first = batch.column("id")[0].as_py()
            with pa.ipc.new_file(idem / f"ids-{first}-{batch.num_rows}.arrow", batch.schema) as w:
                w.write_batch(batch)

    stage.map(upsert, name="idempotent-sink")
    stage.map(throttle(sink_ms), name="memory-slow").collect("memory")
    return flow


def run_once(strategy: str, args: argparse.Namespace, fail_at: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="snapcut-regional-") as d:
        cfg = Checkpointing(
            protocol=args.protocol,
            interval=args.interval,
            restart_attempts=1,
            restart_delay=args.restart_delay,
            failover=strategy,
        )
        started = time.monotonic()
        report = build(args.records, args.sink_ms, Path(d) / "out").run(
            cfg,
            checkpoint_dir=Path(d) / "chk",
            inject_failure=TaskFailure("arrow-sink", 0, "process", fail_at),
        )
        wall = time.monotonic() - started
    return measure(strategy, report, wall)


def measure(strategy: str, report: RunReport, wall: float) -> dict[str, Any]:
    (restart,) = report.restarts
    bucket = report.timeline_bucket_s
    assert restart.at_s is not None and restart.downtime_s is not None
    at = restart.at_s
    failed = report.task_timeline[FAILED]
    relaunch_bucket = int((at + restart.downtime_s) / bucket)
    back = next((b for b in range(relaunch_bucket, len(failed)) if failed[b] > 0), len(failed))
    recovery_s = max(bucket, back * bucket - at)
    healthy = [t for t in report.task_timeline if t.rsplit("-", 1)[0] in SINKS and t != FAILED]

    def rate(lo: float, hi: float) -> float:
        b0, b1 = int(lo / bucket), max(int(lo / bucket) + 1, int(hi / bucket))
        n = sum(sum(report.task_timeline[t][b0:b1]) for t in healthy)
        return n / ((b1 - b0) * bucket)

    before = rate(max(0.0, at - 1.0), at)
    during = rate(at, at + recovery_s)
    taken = sum(sum(report.task_timeline[t]) for t in healthy)
    return {
        "strategy": strategy,
        "scope": restart.scope,
        "restarted": list(restart.tasks),
        "failed_at_s": at,
        "downtime_s": restart.downtime_s,
        "recovery_s": recovery_s,
        "healthy_rate_before": before,
        "healthy_rate_during": during,
        "healthy_share_during": during / before if before else float("nan"),
        "healthy_taken": taken,
        "healthy_dropped": sum(report.replayed_dropped.get(t, 0) for t in healthy),
        "wall_s": wall,
        "bucket_s": bucket,
        "healthy_timeline": [
            sum(
                report.task_timeline[t][b] if b < len(report.task_timeline[t]) else 0
                for t in healthy
            )
            for b in range(max(len(report.task_timeline[t]) for t in healthy))
        ],
    }


def spread(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"{statistics.median(xs):.3g} [{xs[0]:.3g}, {xs[-1]:.3g}]"


def table(runs: list[dict[str, Any]]) -> str:
    rows = [
        "| strategy | tasks restarted | healthy sink subtasks restarted | failed sink back "
        "after (s) | healthy sinks' throughput while it recovers (share of the second "
        "before) | replayed records the healthy sinks dropped | job (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in STRATEGIES:
        mine = [r for r in runs if r["strategy"] == s]
        healthy_restarted = [
            sum(1 for t in r["restarted"] if t.rsplit("-", 1)[0] in SINKS and t != FAILED)
            for r in mine
        ]
        rows.append(
            f"| {s} | {statistics.median(len(r['restarted']) for r in mine):.0f} | "
            f"{statistics.median(healthy_restarted):.0f} | "
            f"{spread([r['recovery_s'] for r in mine])} | "
            f"{spread([r['healthy_share_during'] for r in mine])} | "
            f"{spread([float(r['healthy_dropped']) for r in mine])} | "
            f"{spread([r['wall_s'] for r in mine])} |"
        )
    return "\n".join(rows) + "\n"


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(STRATEGIES), 1, figsize=(8, 7), sharex=True, sharey=True)
    for ax, s in zip(axes, STRATEGIES, strict=True):
        r = next(r for r in runs if r["strategy"] == s)
        b = r["bucket_s"]
        xs = [i * b - r["failed_at_s"] for i in range(len(r["healthy_timeline"]))]
        ax.step(xs, [n / b for n in r["healthy_timeline"]], where="post", lw=1)
        ax.axvline(0, color="red", lw=0.8, ls="--")
        ax.axvspan(0, r["recovery_s"], color="red", alpha=0.08)
        ax.set_title(f"{s}: failed sink back after {r['recovery_s']:.2f} s", fontsize=9)
        ax.set_ylabel("records/s")
    axes[-1].set_xlabel("seconds since the sink failed (healthy sink subtasks, 50 ms buckets)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--records", type=int, default=60_000)
    p.add_argument("--sink-ms", type=float, default=4.0, help="sleep per batch in every sink")
    p.add_argument("--interval", type=float, default=0.2, help="checkpoint interval (s)")
    p.add_argument("--restart-delay", type=float, default=0.25)
    p.add_argument("--protocol", default="aligned")
    p.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "regional_failover"
    )
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # A third of the way: each sink subtask takes about records / 100 batches.
    fail_at = args.records // 100 // 3
    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for rnd in range(args.rounds):
        order = STRATEGIES if rnd % 2 == 0 else tuple(reversed(STRATEGIES))
        for s in order:
            r = run_once(s, args, fail_at)
            r["round"] = rnd
            runs.append(r)
            print(
                f"round {rnd} {s:8s} recovery {r['recovery_s']:.2f} s, healthy share "
                f"{r['healthy_share_during']:.2f}, job {r['wall_s']:.2f} s",
                flush=True,
            )
    meta = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "fail_at_batch": fail_at,
        "machine": {
            "cpus": os.cpu_count(),
            "node": platform.node(),
            "python": platform.python_version(),
        },
        "load_before": load_before,
        "load_after": os.getloadavg(),
    }
    (args.out / "regional_failover.json").write_text(
        json.dumps({"meta": meta, "runs": runs}, indent=1)
    )
    (args.out / "README-table.md").write_text(table(runs))
    plot(runs, args.out / "healthy_sinks.png")
    print(table(runs))


if __name__ == "__main__":
    main()
