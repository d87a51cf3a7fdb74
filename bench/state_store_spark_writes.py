"""A Spark state partition's files written through the page cache against
direct I/O (``O_DIRECT``), and the cold read of them that follows (issue 37:
"Spark state files are written through the page cache, not measured").

One process plays a Spark partition task of ``keyed_state`` under a budget,
with the Spark helper's own pieces: a ``StateTable`` with ``state_memory``
gets KEYS keys (batch 0, in 1M-row updates), and its capture is written as
the partition's full (``checkpoint_streamed``: the runs merged as the file is
written, ``SnapshotWriter.write_state``, fsynced per file as the Spark writer
does); then DIFFS batches of DIFF_KEYS random keys each, each written as a
diff with its filter. After the last diff the partition is read cold, as a
task that did not hold it does (``FsBackend.chain_files`` mapped, then
``StateTable.restore(chain, mapped=True)`` and a lookup of LOOKUPS random
keys): right after the writes, the pages a buffered write left in the page
cache are there to be found; a direct write left none.

The two variants alternate (ABBA), each round on a fresh root. Per round and
variant: the writes' wall time and the process's CPU time over them
(``getrusage``, all threads), the page cache's growth over the writes
(``Cached`` of ``/proc/meminfo``), and the cold read's wall time.

    python bench/state_store_spark_writes.py --keys 10000000 --diffs 4 \\
        --diff-keys 1000000 --rounds 4 --out bench/results/state_store/spark_writes
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs

from children import spread, write_results
from snapcut import snapshots
from snapcut._core import StateTable
from snapcut.snapshots.backend import FsBackend

TASK = ("state", 0)
VARIANTS = ("page_cache", "direct")
SCHEMA = pa.schema([("k", pa.int64()), ("n", pa.int64()), ("total", pa.int64())])
UPDATE_ROWS = 1_000_000


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cached_mb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/meminfo has no Cached line")


def rows(keys: np.ndarray, n: int) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(keys),
            "n": pa.array(np.full(len(keys), n, dtype=np.int64)),
            "total": pa.array(keys * 3 + n),
        },
        schema=SCHEMA,
    )


def one(
    root: Path, direct: bool, args: argparse.Namespace, probes: pa.Array, memory: str
) -> dict[str, Any]:
    """One variant's writes on a fresh root, then the cold read."""
    shutil.rmtree(root, ignore_errors=True)
    writer = snapshots.SnapshotWriter(root, direct_io=direct)
    table = StateTable(SCHEMA, "k", state_memory=memory, spill_dir=str(root) + "-spill")
    rng = np.random.default_rng(11)
    write_s = write_cpu = 0.0
    cache0 = cached_mb()
    chain: list[int] = []
    for cid in range(1, 2 + args.diffs):
        if cid == 1:
            for start in range(0, args.keys, UPDATE_ROWS):
                stop = min(start + UPDATE_ROWS, args.keys)
                table.update(rows(np.arange(start, stop, dtype=np.int64), 1))
        else:
            ks = np.unique(rng.integers(0, args.keys, args.diff_keys, dtype=np.int64))
            table.update(rows(ks, cid))
        _, kind, capture = table.checkpoint_streamed(cid)
        t0, c0 = time.perf_counter(), cpu_s()
        entry = writer.write_state(cid, *TASK, capture, "k", kind=kind, base_chain=list(chain))
        writer.commit(cid, [entry], protocol="spark-microbatch")
        write_s += time.perf_counter() - t0
        write_cpu += cpu_s() - c0
        table.checkpoint_committed(cid)
        chain = [cid] if kind == "full" else [*chain, cid]
    cache_growth = cached_mb() - cache0
    del table
    t0 = time.perf_counter()
    backend = FsBackend(pa.fs.LocalFileSystem(), str(root))
    files = backend.chain_files(1 + args.diffs, TASK, mapped=True)
    assert files is not None and len(files) == 1 + args.diffs, files
    cold = StateTable(SCHEMA, "k", state_memory=memory, spill_dir=str(root) + "-cold")
    cold.restore(
        [(f.checkpoint, f.kind, f.table) for f in files],
        mapped=True,
        filters=[f.filter for f in files],
    )
    found, present = cold.lookup(probes)
    read_s = time.perf_counter() - t0
    total = int(pc.sum(found.column("n")).as_py() or 0)
    del cold, files
    for spill in ("-spill", "-cold"):
        shutil.rmtree(str(root) + spill, ignore_errors=True)
    return {
        "variant": "direct" if direct else "page_cache",
        "write_s": write_s,
        "write_cpu_s": write_cpu,
        "cache_growth_mb": cache_growth,
        "cold_read_s": read_s,
        "found": int(pc.sum(present).as_py() or 0),
        "n_total": total,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--diffs", type=int, default=4)
    p.add_argument("--diff-keys", type=int, default=1_000_000)
    p.add_argument("--lookups", type=int, default=1_000_000)
    p.add_argument("--state-memory", default="256MB")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--work", type=Path, default=Path("/tmp/snapcut-spark-writes-bench"))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    probes = pa.array(np.random.default_rng(3).integers(0, args.keys, args.lookups))
    runs: list[dict[str, Any]] = []
    load = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    for r in range(args.rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            run = {
                "round": r,
                **one(args.work / "root", variant == "direct", args, probes, args.state_memory),
            }
            runs.append(run)
            print(json.dumps(run), flush=True)
    shutil.rmtree(args.work, ignore_errors=True)
    assert len({(x["found"], x["n_total"]) for x in runs}) == 1, "both read the same state"
    by = {v: [x for x in runs if x["variant"] == v] for v in VARIANTS}
    lines = [
        f"{started}; machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs; 1-minute load {load:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end",
        f"one partition: a full of {args.keys:,} keys and {args.diffs} diffs of "
        f"{args.diff_keys:,} random keys, state_memory={args.state_memory}; "
        f"cold read: chain mapped, restore, lookup of {args.lookups:,} keys",
        "",
        "| variant | writes s | writes CPU s | page cache growth MB | cold read s | rounds |",
        "|---|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        xs = by[v]
        lines.append(
            f"| {v} | {spread([x['write_s'] for x in xs], '.2f')} | "
            f"{spread([x['write_cpu_s'] for x in xs], '.2f')} | "
            f"{spread([x['cache_growth_mb'] for x in xs], '.0f')} | "
            f"{spread([x['cold_read_s'] for x in xs], '.2f')} | {len(xs)} |"
        )
    lines.append("")
    for field in ("write_s", "write_cpu_s", "cold_read_s"):
        rs = [d[field] / c[field] for d, c in zip(by["direct"], by["page_cache"], strict=True)]
        lines.append(
            f"direct / page_cache {field}, per round: median {statistics.median(rs):.2f} "
            f"[{min(rs):.2f}, {max(rs):.2f}]"
        )
    print("\n".join(lines))
    if args.out:
        write_results(args.out, runs, lines)


if __name__ == "__main__":
    main()
