"""ABS at large state with the compactor bounded or not (issue 37): the
experiments' three-shuffle job (`snapcut.experiments.flows.build`), 2 tasks
per operator, durable aligned checkpoints every INTERVAL s, against `none`
of the same round. Cases: `none`; `aligned` with the compactor unbounded
(`compaction_cpu_share=1`, the default); `aligned` with it bounded to each
share given. Each round runs every case, the order reversed every other
round (ABBA), so load drifts hit every case alike. Prints each run, then
per case the overhead against `none` of its round (median [min, max]),
checkpoint medians and maxima, and the compactor's work (adopted outputs,
busy and resting seconds, bytes written) from the last checkpoint's
`StoreMetrics`.

    python bench/compaction_budget.py --keys 10000000 --records 100000000 --rounds 3 \
        --shares 0.5 --out bench/results/state_store/budget/10m-keys.json

Run it with the project's venv python, nothing else running.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from snapcut import Checkpointing
from snapcut.experiments.flows import build


def run_case(case: str, keys: int, records: int, interval: float) -> dict[str, Any]:
    flow = build(records=records, keys=keys, parallelism=2)
    if case == "none":
        rep = flow.run(checkpointing=Checkpointing(protocol="none"))
        return {"seconds": rep.duration_s}
    share = float(case.removeprefix("aligned@"))
    root = tempfile.mkdtemp(prefix="snapcut-budget-")
    try:
        cp = Checkpointing(protocol="aligned", interval=interval, compaction_cpu_share=share)
        rep = flow.run(checkpointing=cp, checkpoint_dir=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    done = [c for c in rep.completed_checkpoints if not c.is_final]
    ms = [c.duration_s * 1e3 for c in done]
    last = rep.completed_checkpoints[-1].store
    if last is None:
        raise RuntimeError(f"{case}: a durable run's checkpoint carries no StoreMetrics")
    return {
        "seconds": rep.duration_s,
        "checkpoints": len(done),
        "checkpoint_ms_median": statistics.median(ms) if ms else None,
        "checkpoint_ms_max": max(ms, default=None),
        "runs_max": max(c.store.runs_max for c in rep.completed_checkpoints if c.store),
        "compactions_adopted": last.compaction.adopted,
        "compactions_pending": last.compaction.pending,
        "compaction_busy_s": last.compaction.busy_s,
        "compaction_rested_s": last.compaction.rested_s,
        "compaction_bytes_written": last.compaction.bytes_written,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, required=True)
    p.add_argument("--records", type=int, required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--shares", default="0.5", help="comma-separated compaction_cpu_share values")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    cases = ["none", "aligned@1.0"] + [f"aligned@{float(s)}" for s in a.shares.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    for r in range(a.rounds):
        for case in cases if r % 2 == 0 else cases[::-1]:
            got = run_case(case, a.keys, a.records, a.interval)
            runs[case].append(got)
            print(f"round {r} {case:12s} {got['seconds']:7.2f} s", flush=True)
    summary: dict[str, Any] = {}
    for case in cases[1:]:
        over = [
            c["seconds"] / n["seconds"] - 1 for c, n in zip(runs[case], runs["none"], strict=True)
        ]
        summary[case] = {
            "overhead_median": statistics.median(over),
            "overhead_min": min(over),
            "overhead_max": max(over),
        }
        print(
            f"{case}: overhead {statistics.median(over) * 100:+.1f} % "
            f"[{min(over) * 100:+.1f}, {max(over) * 100:+.1f}]; per run "
            + "; ".join(
                f"{c['checkpoints']} ckpts {c['checkpoint_ms_median']:.0f}/"
                f"{c['checkpoint_ms_max']:.0f} ms, adopted {c['compactions_adopted']} "
                f"(pending {c['compactions_pending']}), "
                f"busy {c['compaction_busy_s']:.1f} s rested {c['compaction_rested_s']:.1f} s"
                for c in runs[case]
            ),
            flush=True,
        )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(
        json.dumps(
            {"args": vars(a) | {"out": str(a.out)}, "runs": runs, "summary": summary}, indent=1
        )
    )


if __name__ == "__main__":
    main()
