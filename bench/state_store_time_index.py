"""A state table's time index under a memory budget (issue 37): the memory
a TTL-style index over many keys costs, two builds side by side.

Each run is a child process (``PYTHONPATH`` selects the build; empty: the
installed one) that builds one ``StateTable`` of KEYS int64 keys with a
count and an expiry column (ms) under `state_memory` BUDGET, loading the
keys in batches of 1M rows with random expiries over TTL ms, then runs
BATCHES micro-batches: each updates UPDATES random keys (a new expiry, later
than the old), advances the clock by STEP ms, asks the index which keys are
``due`` and deletes them (what TTL eviction does). Variants: ``index`` (the
table has ``time_column="expires"``) and ``none`` (the same table and work
without an index: what the index adds is the difference). Per run: the
child's VmHWM and largest RssAnon (sampled every 20 ms), the load's and the
batches' times, the keys expired (the same in every run of a variant: the
same seed), and the table's flushes.

Builds and variants run in rounds, each round in the opposite order to the
last. Writes ``<out>/runs.jsonl`` and prints a Markdown table of medians
and ranges.

    python bench/state_store_time_index.py --a target/ab-old/site --b "" \\
        --keys 20000000 --budget 256MB --rounds 2 \\
        --out bench/results/state_store/time_index
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from children import child_env, run_json_child, spread

CHILD = r"""
import json, sys, time
import numpy as np
import pyarrow as pa
from children import MemoryPeaks
from snapcut._core import StateTable

keys, budget, spill, variant, batches, updates, ttl, step = sys.argv[1:9]
keys, batches, updates, ttl, step = map(int, (keys, batches, updates, ttl, step))
peaks = MemoryPeaks()
schema = pa.schema([("k", pa.int64()), ("n", pa.int64()), ("expires", pa.int64())])
table = StateTable(
    schema, "k", state_memory=budget, spill_dir=spill,
    time_column="expires" if variant == "index" else None,
)
rng = np.random.default_rng(7)
started = time.monotonic()
for lo in range(0, keys, 1 << 20):
    k = np.arange(lo, min(lo + (1 << 20), keys), dtype=np.int64)
    expires = rng.integers(0, ttl, len(k))
    table.update(pa.record_batch([k, np.ones(len(k), np.int64), expires], schema=schema))
load_s = time.monotonic() - started
now, expired, batch_s = 0, 0, []
for b in range(batches):
    t0 = time.monotonic()
    k = np.unique(rng.integers(0, keys, updates))
    got = table.get(pa.array(k))
    live = got.column("k").to_numpy()
    expires = got.column("expires").to_numpy() + ttl
    table.update(pa.record_batch([live, got.column("n").to_numpy() + 1, expires], schema=schema))
    now += step
    if variant == "index":
        due = table.due(now)
    else:
        due = pa.array(np.zeros(0, np.int64))
    expired += len(due)
    table.delete(due)
    batch_s.append(time.monotonic() - t0)
memory = peaks.stop()
stats = table.spill_stats() or {}
print(json.dumps({
    "load_s": round(load_s, 3),
    "batch_s_median": round(sorted(batch_s)[len(batch_s) // 2], 3),
    "batches_s": round(sum(batch_s), 3),
    "expired": expired,
    "live": len(table),
    "flushes": stats.get("flushes"),
    **memory,
}))
"""


def child(pythonpath: str, args: argparse.Namespace, variant: str, spill: Path) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-c",
        CHILD,
        str(args.keys),
        args.budget,
        str(spill),
        variant,
        str(args.batches),
        str(args.updates),
        str(args.ttl),
        str(args.step),
    ]
    return run_json_child(cmd, child_env(pythonpath), args.timeout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", required=True, help="PYTHONPATH of build A ('' = installed)")
    p.add_argument("--b", required=True, help="PYTHONPATH of build B")
    p.add_argument("--keys", type=int, default=20_000_000)
    p.add_argument("--budget", default="256MB")
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--updates", type=int, default=500_000)
    p.add_argument("--ttl", type=int, default=3_600_000, help="expiries spread over this (ms)")
    p.add_argument("--step", type=int, default=60_000, help="the clock's advance a batch (ms)")
    p.add_argument("--variants", default="index,none")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spill = Path(tempfile.mkdtemp(prefix="snapcut-time-index-"))
    cells = [(b, v) for v in args.variants.split(",") for b in ("A", "B")]
    builds = {"A": args.a, "B": args.b}
    rows: list[dict[str, Any]] = []
    with open(out / "runs.jsonl", "w") as f:
        f.write(json.dumps({"args": vars(args)}) + "\n")
        for rnd in range(args.rounds):
            for build, variant in cells if rnd % 2 == 0 else cells[::-1]:
                load = os.getloadavg()[0]
                row = child(builds[build], args, variant, spill)
                row |= {"build": build, "variant": variant, "round": rnd, "load_1m": round(load, 2)}
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")
                f.flush()
                rows.append(row)
                time.sleep(2)
    print()
    print("| build | variant | VmHWM MB | RssAnon peak MB | load s | batch s (median) | expired |")
    print("|---|---|---|---|---|---|---|")
    for build, variant in cells:
        mine = [r for r in rows if r["build"] == build and r["variant"] == variant]

        def col(k: str, mine: list[dict[str, Any]] = mine) -> str:
            return spread([float(r[k]) for r in mine])

        print(
            f"| {build} | {variant} | {col('vm_hwm_mb')} | {col('rss_anon_peak_mb')} "
            f"| {col('load_s')} | {col('batch_s_median')} | {mine[0]['expired']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
