"""A cold restore of a timed state table (issue 37): what a time index adds
to a mapped restore, with and without the index stored beside the full
(format 5), one or two builds side by side.

The parent writes once one sorted full capture of KEYS int64 keys with a
count and an expiry (ms, random over TTL) as a partition's state file, with
the format's writer (``write_state_file``, as a Spark task writes it), its
schema naming the time column, so the index is stored beside it. In each
round a child process a build times that write with and without the index
(what storing it costs each full; the first write of each child is not
timed: it waits on the page cache's writeback of the parent's files). Each
run is a child process
(``PYTHONPATH`` selects the build; empty: the installed one) that maps the
file, restores a ``StateTable`` from it (``restore(mapped=True)``, as a cold
worker opens its partition) with or without ``state_memory`` BUDGET, then
asks ``due`` once (the keys a minute's clock passed). Variants: ``index``
(``time_column="expires"``: the restore notes every row's time), ``stored``
(the same index, taken from the file stored beside the full, mapped:
``restore(times=...)``) and ``none`` (no index: the restore maps the file
and reads nothing). Per run:
the restore's and the ``due``'s seconds, the keys due (the same in every
run), the index's runs, the child's VmHWM, largest RssAnon (sampled every
20 ms) and RssAnon after the ``due`` (what the restored table holds).

Builds, variants and budgets run in rounds, each round in the opposite
order to the last. Writes ``<out>/runs.jsonl`` and prints a Markdown table
of medians and ranges.

    python bench/state_store_timed_restore.py --a "" \\
        --keys 10000000 --budgets none,256MB --variants index,stored,none --rounds 3 \\
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
from snapcut._core import format as fmt
from snapcut.snapshots import TIME_METADATA

SCHEMA = pa.schema([("k", pa.int64()), ("n", pa.int64()), ("expires", pa.int64())])

WRITE_CHILD = r"""
import json, shutil, sys
from pathlib import Path
from state_store_timed_restore import full_capture, write_full
keys, ttl, work = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
out = {}
for indexed in (True, False, True, False)[int(sys.argv[4]):][:3]:
    batch = full_capture(keys, ttl, indexed)
    took, _ = write_full(work, batch)
    shutil.rmtree(work)
    out.setdefault(str(indexed), []).append(took)
# The first write is a warm-up.
first = next(iter(out))
out[first] = out[first][1:]
print(json.dumps({k: round(min(v), 3) for k, v in out.items()}))
"""

CHILD = r"""
import json, sys, time
import pyarrow as pa
from children import MemoryPeaks, status_bytes
from snapcut._core import StateTable

path, times_path, variant, budget, spill, due_at = sys.argv[1:7]
budget = None if budget == "none" else budget
peaks = MemoryPeaks()
started = time.monotonic()
batch = pa.ipc.open_file(pa.memory_map(path)).get_batch(0)
times = None
if variant == "stored":
    times = pa.ipc.open_file(pa.memory_map(times_path)).get_batch(0)
table = StateTable(
    batch.schema, "k", state_memory=budget, spill_dir=spill if budget else None,
    time_column=None if variant == "none" else "expires",
)
table.restore([(1, "full", batch)], mapped=True, times=times)
restore_s = time.monotonic() - started
stored = (table.spill_stats() or {}).get("times_stored")
assert stored == (1 if variant == "stored" else 0), stored
started = time.monotonic()
due = None if variant == "none" else len(table.due(int(due_at)))
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


def full_capture(keys: int, ttl: int, indexed: bool) -> pa.RecordBatch:
    """One full capture: KEYS rows in key order, random expiries; `indexed`:
    its schema names the time column, as a timed table's full does."""
    rng = np.random.default_rng(7)
    k = np.arange(keys, dtype=np.int64)
    schema = SCHEMA.with_metadata({TIME_METADATA: "expires"} if indexed else {})
    return pa.record_batch([k, np.ones(keys, np.int64), rng.integers(0, ttl, keys)], schema=schema)


def write_full(directory: Path, batch: pa.RecordBatch) -> tuple[float, dict[str, Any]]:
    """Writes `batch` as task agg-0's full with the format's writer; returns
    the seconds it took and the entry."""
    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    entry = fmt.write_state_file(str(directory), "", "agg", 0, batch, "k", "full", None, True)
    return time.monotonic() - started, entry


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", required=True, help="PYTHONPATH of build A ('' = installed)")
    p.add_argument("--b", default=None, help="PYTHONPATH of build B (none: A alone)")
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--budgets", default="none,256MB", help="'none': no state_memory")
    p.add_argument("--ttl", type=int, default=3_600_000, help="expiries spread over this (ms)")
    p.add_argument("--due-at", type=int, default=60_000, help="the due threshold (ms)")
    p.add_argument("--variants", default="index,stored,none")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="snapcut-timed-restore-"))
    builds = {"A": args.a} | ({} if args.b is None else {"B": args.b})
    cells = [
        (b, v, m) for m in args.budgets.split(",") for v in args.variants.split(",") for b in builds
    ]
    rows: list[dict[str, Any]] = []
    writes: dict[tuple[str, bool], list[float]] = {(b, i): [] for b in builds for i in (1, 0)}
    try:
        _, entry = write_full(work, full_capture(args.keys, args.ttl, indexed=True))
        full = work / entry["path"]
        times = work / entry["times"]["path"]
        with open(out / "runs.jsonl", "w") as f:
            f.write(json.dumps({"args": vars(args)}) + "\n")
            for rnd in range(args.rounds):
                # What storing the index costs a full's write, interleaved.
                for build in builds if rnd % 2 == 0 else list(builds)[::-1]:
                    cmd = [sys.executable, "-c", WRITE_CHILD, str(args.keys), str(args.ttl)]
                    cmd += [str(work / "write"), str(rnd % 2)]
                    took = run_json_child(cmd, child_env(builds[build]), args.timeout)
                    for indexed in (True, False):
                        writes[build, indexed].append(took[str(indexed)])
                        line = {"write_s": took[str(indexed)], "indexed": indexed}
                        line |= {"round": rnd, "build": build}
                        print(json.dumps(line), flush=True)
                        f.write(json.dumps(line) + "\n")
                    time.sleep(2)
                for build, variant, budget in cells if rnd % 2 == 0 else cells[::-1]:
                    spill = work / "spill"
                    shutil.rmtree(spill, ignore_errors=True)
                    spill.mkdir()
                    load = os.getloadavg()[0]
                    cmd = [sys.executable, "-c", CHILD, str(full), str(times), variant, budget]
                    cmd.append(str(spill))
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
    print()
    print("| the full's write | build | s |")
    print("|---|---|---|")
    for (build, indexed), took in writes.items():
        print(f"| {'with' if indexed else 'without'} its index | {build} | {spread(took, '.3f')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
