"""The local runtime's Python keyed process (`key_by(k).process(fn)`) under a
memory budget against the same job in memory (issue 37).

The job: RECORDS generated dwell events of KEYS users, parallelism 2,
``key_by("user").process(fn)`` where `fn` keeps an event count per user
(a small tuple state; no output rows, so the state is what is measured),
aligned checkpoints every INTERVAL seconds into a durable root. Two cases
per round, in ABBA order: no budget (live Python objects, pickled at each
checkpoint) and ``state_memory=BUDGET`` (pickles in the spilling state
table). Each run is a child process: the job's time, its memory peaks
(VmHWM and the anonymous peak, `children.MemoryPeaks`), the checkpoints'
median and longest duration, and the spill figures. Then a second child
resumes the finished root (``resume=True``): the restore of the final
checkpoint, whose every key the in-memory process unpickles and the
budgeted one opens as mapped runs; its wall time and peaks.

Writes ``<out>/runs.jsonl`` and prints a Markdown table of medians and
ranges, with the budgeted run's time over the in-memory run of its round.

    python bench/keyed_process_memory.py --keys 1000000 --records 2000000 \\
        --rounds 2 --out bench/results/state_store/keyed_process
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from children import child_env, run_json_child, spread

CHILD = r"""
import json, statistics, sys, time
from children import MemoryPeaks
peaks = MemoryPeaks()
from snapcut.checkpointing import Checkpointing
from snapcut.dataflow import Dataflow

keys, records, budget, interval, root, spill, resume = sys.argv[1:8]
keys, records, resume = int(keys), int(records), resume == "resume"

def count(user, rows, state):
    return None, ((0 if state is None else state[0]) + rows.num_rows, user)

flow = Dataflow(parallelism=2)
events = flow.generate_dwell_events(users=keys, count=records, seed=11, batch_size=8192)
events.key_by("user").process(count, name="keyed").collect("out")
extra = {"state_memory": budget, "spill_dir": spill} if budget else {}
cp = Checkpointing(interval=float(interval), full_every=10, **extra)
started = time.perf_counter()
report = flow.run(cp, checkpoint_dir=root, resume=resume)
wall = time.perf_counter() - started
spill = {t: s for t, s in (report.spill or {}).items()}
done = [c.duration_s for c in report.checkpoints if c.completed and not c.is_final]
print(json.dumps({
    "job_s": round(report.duration_s, 3),
    "wall_s": round(wall, 3),
    "restored_from": report.restored_from,
    "checkpoints": len(done),
    "checkpoint_median_s": round(statistics.median(done), 3) if done else None,
    "checkpoint_max_s": round(max(done), 3) if done else None,
    "flushes": sum(s["flushes"] for s in spill.values()),
    "run_probes": sum(s["run_probes"] for s in spill.values()),
    "bases_mapped": sum(s["bases_mapped"] for s in spill.values()),
    "diffs_mapped": sum(s["diffs_mapped"] for s in spill.values()),
    **peaks.stop(),
}))
"""


def child(args: argparse.Namespace, budget: str, root: Path, resume: bool) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-c",
        CHILD,
        str(args.keys),
        str(args.records),
        budget,
        str(args.interval),
        str(root / "chk"),
        str(root / "spill"),
        "resume" if resume else "fresh",
    ]
    return run_json_child(cmd, child_env(""), args.timeout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--budget", default="64MB")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not args.budget:
        raise SystemExit("--budget must be a size (64MB): the bench compares a budgeted run")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = {"memory": "", "budget": args.budget}
    rows: list[dict[str, Any]] = []
    with open(out / "runs.jsonl", "w") as f:
        f.write(json.dumps({"args": vars(args)}) + "\n")
        for rnd in range(args.rounds):
            order = ["memory", "budget"] if rnd % 2 == 0 else ["budget", "memory"]
            for i, case in enumerate(order):
                root = Path(tempfile.mkdtemp(prefix="keyed-bench-"))
                try:
                    for phase in ("run", "resume"):
                        load = os.getloadavg()[0]
                        row = child(args, cases[case], root, phase == "resume")
                        row |= {"case": case, "phase": phase, "round": rnd, "order": i}
                        row["load_1m"] = round(load, 2)
                        print(json.dumps(row), flush=True)
                        f.write(json.dumps(row) + "\n")
                        f.flush()
                        rows.append(row)
                        time.sleep(2)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
    memory = {r["round"]: r for r in rows if r["case"] == "memory" and r["phase"] == "run"}
    print()
    print(
        "| case | job, s | over in-memory (same round) | VmHWM, MB | anon peak, MB "
        "| checkpoint median / max, s | resume wall, s | resume anon peak, MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for case in cases:
        runs = [r for r in rows if r["case"] == case and r["phase"] == "run"]
        resumes = [r for r in rows if r["case"] == case and r["phase"] == "resume"]
        ratio = [r["job_s"] / memory[r["round"]]["job_s"] for r in runs]
        cells = [
            spread([r["job_s"] for r in runs], ".3g"),
            spread(ratio, ".2f"),
            spread([r["vm_hwm_mb"] for r in runs], ".0f"),
            spread([r["rss_anon_peak_mb"] for r in runs], ".0f"),
            spread([r["checkpoint_median_s"] or 0 for r in runs], ".2f")
            + " / "
            + spread([r["checkpoint_max_s"] or 0 for r in runs], ".2f"),
            spread([r["wall_s"] for r in resumes], ".2f"),
            spread([r["rss_anon_peak_mb"] for r in resumes], ".0f"),
        ]
        print(f"| {case} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
