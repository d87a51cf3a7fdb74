"""A Spark state task's first batch under a memory budget, without Spark
(issue 37: "Python worker peak RSS within budget + 300 MB"): the task code a
Python worker runs (`PartitionTask`, its input held up to a quarter of the
budget and the rest applied in parts of whole keys, `key_parts`, as
`snapcut.spark.state.task` does), on a local root, in a child process per
run whose ``PYTHONPATH`` selects the build.

Batch 0 of one partition creates KEYS keys of the level-1 aggregate (count
and sum per user), from an input of KEYS rows in 64k-row Arrow batches made
as the task reads them (so the input is never held whole), under
``state_memory=BUDGET``. Per run: the peaks before the commit (the batch
applied: parts, spills) and after it (version 0 written: the table's full
capture, merged from its runs into its file): VmHWM (every resident page,
mapped runs' pages included) and the largest RssAnon seen (heap only,
sampled every 20 ms), and the times.

    python bench/state_store_batch0.py --a target/ab-X/site --b "" \\
        --keys 5000000 --rounds 3 --out bench/results/state_store/batch0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from children import child_env, run_json_child

CHILD = r"""
import json, os, sys, time
from pathlib import Path
from children import MemoryPeaks, status_bytes

root, keys, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
peaks = MemoryPeaks()
import numpy as np
import pyarrow as pa
from snapcut._core import KeyedAggregates
from snapcut.spark.processors import AggregateProcessor
from snapcut.spark.roots import schema_bytes
from snapcut.spark.state.key_parts import hold, key_parts
from snapcut.spark.state.worker_memory import input_held_bytes
from snapcut.spark.state.partition import PartitionTask
from snapcut.spark.state.warm import StateCache
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import RootSpec

schema = pa.schema([("user", pa.int64()), ("v", pa.int64())])
specs = [("count", None, "n"), ("sum", "v", "total")]
kernel = KeyedAggregates(schema, "user", specs)
spec = RootSpec(
    uri=root, vertex="state", partitions=1, key=("user",), state_key="user",
    state_schema=schema_bytes(kernel.state_schema), full_every=10, retain=10,
)
processor = AggregateProcessor(
    key=("user",), state_key="user", state_schema=kernel.state_schema,
    output_schema=pa.schema([("user", pa.int64()), ("n", pa.int64()), ("total", pa.int64())]),
    specs=specs,
)
StateRoot(spec).init("aggregate")
# Every user once, scattered: an affine permutation of 0..keys (1,000,003 is
# prime, so coprime with any key count it does not divide), made a batch at
# a time, so the input is never held whole (a permutation array of 20M keys
# would be 160 MB of the child's memory that a Spark worker never holds).
assert keys % 1_000_003 != 0

def batches():
    for at in range(0, keys, 1 << 16):
        u = (np.arange(at, min(at + (1 << 16), keys), dtype=np.int64) * 1_000_003 + 7) % keys
        yield pa.record_batch([pa.array(u), pa.array(np.ones(len(u), np.int64))], schema=schema)

baseline = status_bytes("RssAnon")
t0 = time.monotonic()
task = PartitionTask(StateRoot(spec), 0, 0, "bench", None, cache=StateCache(0), state_memory=budget)
held, rest = hold(batches(), input_held_bytes(budget))
assert rest is not None, "the input must outgrow what the task holds"
parts = key_parts(held, rest, schema, ("user",), 0)
del held
rows_out = sum(out.num_rows for out in task.apply_parts(parts, processor, None))
applied_s = time.monotonic() - t0
before = peaks.stop()
peaks = MemoryPeaks()
t1 = time.monotonic()
task.commit()
commit_s = time.monotonic() - t1
after = peaks.stop()
print(json.dumps({
    "rows_out": rows_out,
    "baseline_anon_mb": round(baseline / 2**20),
    "apply_s": round(applied_s, 2),
    "commit_s": round(commit_s, 2),
    "apply_vm_hwm_mb": before["vm_hwm_mb"],
    "apply_rss_anon_peak_mb": before["rss_anon_peak_mb"],
    "vm_hwm_mb": after["vm_hwm_mb"],
    "commit_rss_anon_peak_mb": after["rss_anon_peak_mb"],
    "state_file_mb": round(sum(f.stat().st_size for f in Path(root).rglob("*.arrow")) / 2**20),
}), flush=True)
"""


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}, {max(values):,.0f}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", required=True, help="build A's site dir ('' = installed)")
    p.add_argument("--b", required=True, help="build B's site dir ('' = installed)")
    p.add_argument("--keys", type=int, default=5_000_000)
    p.add_argument("--budget", type=int, default=256 << 20, help="state_memory, bytes")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    builds = {"A": args.a, "B": args.b}
    runs: list[dict[str, Any]] = []
    load = os.getloadavg()[0]
    for r in range(args.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            work = Path(tempfile.mkdtemp(prefix="snapcut-batch0-"))
            try:
                res = run_json_child(
                    [
                        sys.executable,
                        "-c",
                        CHILD,
                        str(work / "root"),
                        str(args.keys),
                        str(args.budget),
                    ],
                    child_env(builds[name], TMPDIR=str(work)),
                    args.timeout,
                )
            finally:
                shutil.rmtree(work, ignore_errors=True)
            run = {"round": r, "build": name, **res}
            runs.append(run)
            print(json.dumps(run), flush=True)
    (out / "runs.jsonl").write_text("".join(json.dumps(x) + "\n" for x in runs))
    cols = [
        ("apply_s", "apply s"),
        ("commit_s", "commit s"),
        ("apply_rss_anon_peak_mb", "RssAnon peak applying MB"),
        ("commit_rss_anon_peak_mb", "RssAnon peak committing MB"),
        ("vm_hwm_mb", "VmHWM MB"),
    ]
    lines = [
        f"1-minute load {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
        f"{args.keys:,} keys, budget {args.budget / 2**20:,.0f} MB",
        "",
        "| build | " + " | ".join(c[1] for c in cols) + " | rounds |",
        "|---|" + "---|" * len(cols) + "---|",
    ]
    for name in ("A", "B"):
        xs = [x for x in runs if x["build"] == name]
        lines.append(
            f"| {name} | "
            + " | ".join(spread([float(x[c]) for x in xs]) for c, _ in cols)
            + f" | {len(xs)} |"
        )
    text = "\n".join(lines)
    print(text)
    (out / "output.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
