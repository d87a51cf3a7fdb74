"""A restart of the local runtime at large keyed state under a memory budget
(issue 37): two builds side by side, resuming the same durable root.

A prepared root (made once, by the build running this script): a job of one
keyed aggregate stage (parallelism 2, `state_memory` per subtask) over
RECORDS generated events of KEYS users, aligned checkpoints every INTERVAL s
into a durable root, `full_every` FULL_EVERY, run to its end. Each measured
run copies that root and resumes it (`resume=True`) in a child process whose
``PYTHONPATH`` selects the build (empty: the installed one), with the source
extended by EXTRA events, so the restored aggregates take batches again and
write checkpoints. Per run: the child's wall time from start to the job's
end, the job's own time (`RunReport.duration_s`), the checkpoint restored,
and the child's peak memory: VmHWM (every resident page, the mapped state
files' pages included) and the largest RssAnon seen (heap and anonymous
memory only; sampled every 20 ms).

Builds run in rounds, each round in the opposite order to the last (ABBA).
Writes ``<out>/runs.jsonl`` and prints a Markdown table of medians and
ranges.

    python bench/state_store_restore.py --a target/ab-old/site --b "" \\
        --keys 10000000 --records 20000000 --extra 1000000 --rounds 3 \\
        --out bench/results/state_store/restore
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
import json, os, sys, time
from children import MemoryPeaks
from snapcut import Checkpointing, Dataflow

keys, records, root, budget, spill, interval, full_every = sys.argv[1:8]
started = time.monotonic()
peaks = MemoryPeaks()
flow = Dataflow(parallelism=2)
events = flow.generate_dwell_events(users=int(keys), count=int(records), seed=11)
events.key_by("user").aggregate(
    name="agg", forward=True, n="count", total=("sum", "dwell_ms")
).collect("out")
cp = Checkpointing(
    interval=float(interval), state_memory=budget, spill_dir=spill, full_every=int(full_every)
)
resume = os.environ.get("BENCH_RESUME") == "1"
report = flow.run(cp, checkpoint_dir=root, resume=resume)
memory = peaks.stop()
print(json.dumps({
    "wall_s": round(time.monotonic() - started, 3),
    "job_s": round(report.duration_s, 3),
    "restored_from": report.restored_from,
    "rows_out": report.results["out"].num_rows,
    "checkpoints": len(report.completed_checkpoints),
    **memory,
    "bases_mapped": sum(s.get("bases_mapped", 0) for s in report.spill.values()),
}))
"""


def child(
    pythonpath: str, args: argparse.Namespace, records: int, root: Path, resume: bool, spill: Path
) -> dict[str, Any]:
    env = child_env(pythonpath, BENCH_RESUME="1" if resume else "0")
    cmd = [
        sys.executable,
        "-c",
        CHILD,
        str(args.keys),
        str(records),
        str(root),
        args.budget,
        str(spill),
        str(args.interval),
        str(args.full_every),
    ]
    return run_json_child(cmd, env, args.timeout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", required=True, help="PYTHONPATH of build A ('' = installed)")
    p.add_argument("--b", required=True, help="PYTHONPATH of build B")
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--records", type=int, default=20_000_000)
    p.add_argument("--extra", type=int, default=1_000_000)
    p.add_argument("--budget", default="256MB")
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--full-every", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--work", default=None, help="where the roots go (default: a temp dir)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="snapcut-restore-"))
    work.mkdir(parents=True, exist_ok=True)
    prepared = work / "prepared"
    shutil.rmtree(prepared, ignore_errors=True)
    spill = work / "spill"
    prep = child("", args, args.records, prepared, False, spill)
    print(json.dumps({"prepared": prep}), flush=True)
    builds = {"A": args.a, "B": args.b}
    rows: list[dict[str, Any]] = []
    with open(out / "runs.jsonl", "w") as f:
        f.write(json.dumps({"prepared": prep, "args": vars(args)}) + "\n")
        for rnd in range(args.rounds):
            order = ["A", "B"] if rnd % 2 == 0 else ["B", "A"]
            for i, build in enumerate(order):
                root = work / "root"
                shutil.rmtree(root, ignore_errors=True)
                shutil.copytree(prepared, root)
                load = os.getloadavg()[0]
                row = child(builds[build], args, args.records + args.extra, root, True, spill)
                row |= {"build": build, "round": rnd, "order": i, "load_1m": round(load, 2)}
                if row["restored_from"] is None:
                    raise SystemExit(f"build {build} did not restore: {row}")
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")
                f.flush()
                rows.append(row)
                time.sleep(2)
    shutil.rmtree(work / "root", ignore_errors=True)
    print()
    print("| build | wall, s | job, s | VmHWM, MB | RssAnon peak, MB | bases mapped |")
    print("|---|---|---|---|---|---|")
    for build in builds:
        mine = [r for r in rows if r["build"] == build]
        cells = [
            spread([r[k] for r in mine])
            for k in ("wall_s", "job_s", "vm_hwm_mb", "rss_anon_peak_mb", "bases_mapped")
        ]
        print(f"| {build} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
