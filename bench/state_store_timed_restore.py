"""A cold restore of a timed state table (issue 37): what a time index adds
to a mapped restore, two builds side by side.

The parent writes once one sorted full capture of KEYS int64 keys with a
count and an expiry (ms, random over TTL) as an Arrow IPC file, as a
partition's state file in a root. Each run is a child process
(``PYTHONPATH`` selects the build; empty: the installed one) that maps the
file, restores a ``StateTable`` from it (``restore(mapped=True)``, as a cold
worker opens its partition) with or without ``state_memory`` BUDGET, then
asks ``due`` once (the keys a minute's clock passed). Variants: ``index``
(``time_column="expires"``: the restore notes every row's time) and
``none`` (no index: the restore maps the file and reads nothing). Per run:
the restore's and the ``due``'s seconds, the keys due (the same in every
run), the index's runs, the child's VmHWM, largest RssAnon (sampled every
20 ms) and RssAnon after the ``due`` (what the restored table holds).

Builds, variants and budgets run in rounds, each round in the opposite
order to the last. Writes ``<out>/runs.jsonl`` and prints a Markdown table
of medians and ranges.

    python bench/state_store_timed_restore.py --a target/ab-old/site --b "" \\
        --keys 10000000 --budgets none,256MB --rounds 3 \\
        --out bench/results/state_store/timed_restore
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

import numpy as np
import pyarrow as pa

from children import child_env, run_json_child, spread

SCHEMA = pa.schema([("k", pa.int64()), ("n", pa.int64()), ("expires", pa.int64())])

CHILD = r"""
import json, sys, time
import pyarrow as pa
from children import MemoryPeaks, status_bytes
from snapcut._core import StateTable

path, variant, budget, spill, due_at = sys.argv[1:6]
budget = None if budget == "none" else budget
peaks = MemoryPeaks()
started = time.monotonic()
batch = pa.ipc.open_file(pa.memory_map(path)).get_batch(0)
table = StateTable(
    batch.schema, "k", state_memory=budget, spill_dir=spill if budget else None,
    time_column="expires" if variant == "index" else None,
)
table.restore([(1, "full", batch)], mapped=True)
restore_s = time.monotonic() - started
started = time.monotonic()
due = len(table.due(int(due_at))) if variant == "index" else None
due_s = time.monotonic() - started
held = round(status_bytes("RssAnon") / 2**20)
memory = peaks.stop()
print(json.dumps({
    "restore_s": round(restore_s, 3),
    "due_s": round(due_s, 4),
    "due": due,
    "live": len(table),
    "time_runs": (table.spill_stats() or {}).get("time_runs"),
    "rss_anon_after_mb": held,
    **memory,
}))
"""


def write_full(path: Path, keys: int, ttl: int) -> None:
    """One sorted full capture: KEYS rows in key order, random expiries."""
    rng = np.random.default_rng(7)
    k = np.arange(keys, dtype=np.int64)
    batch = pa.record_batch([k, np.ones(keys, np.int64), rng.integers(0, ttl, keys)], schema=SCHEMA)
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, SCHEMA) as w:
        w.write_batch(batch)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", required=True, help="PYTHONPATH of build A ('' = installed)")
    p.add_argument("--b", required=True, help="PYTHONPATH of build B")
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--budgets", default="none,256MB", help="'none': no state_memory")
    p.add_argument("--ttl", type=int, default=3_600_000, help="expiries spread over this (ms)")
    p.add_argument("--due-at", type=int, default=60_000, help="the due threshold (ms)")
    p.add_argument("--variants", default="index,none")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="snapcut-timed-restore-"))
    full = work / "full.arrow"
    write_full(full, args.keys, args.ttl)
    cells = [
        (b, v, m) for m in args.budgets.split(",") for v in args.variants.split(",") for b in "AB"
    ]
    builds = {"A": args.a, "B": args.b}
    rows: list[dict[str, Any]] = []
    try:
        with open(out / "runs.jsonl", "w") as f:
            f.write(json.dumps({"args": vars(args)}) + "\n")
            for rnd in range(args.rounds):
                for build, variant, budget in cells if rnd % 2 == 0 else cells[::-1]:
                    spill = work / "spill"
                    shutil.rmtree(spill, ignore_errors=True)
                    spill.mkdir()
                    load = os.getloadavg()[0]
                    cmd = [sys.executable, "-c", CHILD, str(full), variant, budget, str(spill)]
                    cmd.append(str(args.due_at))
                    row = run_json_child(cmd, child_env(builds[build]), args.timeout)
                    row |= {"build": build, "variant": variant, "budget": budget}
                    row |= {"round": rnd, "load_1m": round(load, 2)}
                    print(json.dumps(row), flush=True)
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    rows.append(row)
                    time.sleep(2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    head = "restore s | due s | VmHWM MB | RssAnon peak MB | held MB | due"
    print(f"| budget | variant | build | {head} |")
    print("|---|---|---|---|---|---|---|---|---|")
    for build, variant, budget in cells:
        cell = (build, variant, budget)
        mine = [r for r in rows if (r["build"], r["variant"], r["budget"]) == cell]

        def col(k: str, mine: list[dict[str, Any]] = mine) -> str:
            return spread([float(r[k]) for r in mine])

        print(
            f"| {budget} | {variant} | {build} | {col('restore_s')} | {col('due_s')} "
            f"| {col('vm_hwm_mb')} | {col('rss_anon_peak_mb')} | {col('rss_anon_after_mb')} "
            f"| {mine[0]['due']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
