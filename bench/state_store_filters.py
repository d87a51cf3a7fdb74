"""A cold restore of one state partition with the diffs' stored bloom filters
(format 3) against the same restore building them from the diffs' keys
(issue 37: "filters stored beside files").

A root is written once with the Spark helper's writer (`SnapshotWriter`,
files sorted by key, as every Spark state file is): a full of KEYS keys,
then DIFFS diffs of DIFF_KEYS random keys each (a tenth of them deletes),
each diff with its filter beside it. Each measured restore reads the chain
mapped (`FsBackend.chain_files`, the Spark partition task's read; the files'
pages are in the page cache after the first round) and opens a table on it
lazily (`StateTable.restore(chain, mapped=True)`): the full as its base
run, each diff as a run, with `filters=` the stored ones ("stored") or none,
so that each run hashes its keys to build one ("built"). A second root of
the same chain whose diffs name the live keys their chain rebuilds
(``snapcut.live_keys``, as a table's captures do) is restored with the
stored filters ("counted"): no diff key is looked up in the older runs to
count them. The variants alternate (forward, then backward), in one
process; per restore: the restore's time (reading the chain excluded), and
a lookup of LOOKUPS random keys after it (the filters at work: the variants
must find the same rows and count the same live keys).

    python bench/state_store_filters.py --keys 10000000 --diffs 6 \\
        --diff-keys 500000 --rounds 5 --out bench/results/state_store/filters
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs

from children import write_results
from snapcut import snapshots
from snapcut._core import StateTable
from snapcut.snapshots.backend import ChainFile, FsBackend

TASK = ("state", 0)
VARIANTS = ("stored", "built", "counted")


def write_root(root: Path, keys: int, diffs: int, diff_keys: int, counts: bool = False) -> None:
    """`counts`: each diff names the live keys its chain rebuilds
    (``snapshots.LIVE_KEYS_METADATA``), as a table's capture does."""
    rng = np.random.default_rng(7)
    live = np.zeros(2 * keys, dtype=bool)
    live[:keys] = True
    writer = snapshots.SnapshotWriter(root)
    full = pa.table(
        {
            "k": pa.array(np.arange(keys, dtype=np.int64)),
            "n": pa.array(np.ones(keys, dtype=np.int64)),
            "total": pa.array(rng.integers(0, 1000, keys, dtype=np.int64)),
        }
    )
    entries = [writer.write_state(1, *TASK, full, "k", sort=True, base_chain=[])]
    writer.commit(1, entries, protocol="spark-microbatch")
    chain = [1]
    for cid in range(2, 2 + diffs):
        ks = np.unique(rng.integers(0, 2 * keys, diff_keys, dtype=np.int64))
        deleted = rng.random(len(ks)) < 0.1
        diff = pa.table(
            {
                "k": pa.array(ks),
                "n": pa.array(np.where(deleted, 0, cid), type=pa.int64()),
                "total": pa.array(np.where(deleted, 0, cid * 7), type=pa.int64()),
                snapshots.DELETED_COLUMN: pa.array(deleted),
            }
        )
        live[ks] = ~deleted
        if counts:
            meta = {snapshots.LIVE_KEYS_METADATA: str(int(np.count_nonzero(live)))}
            diff = diff.replace_schema_metadata(meta)
        entry = writer.write_state(
            cid, *TASK, diff, "k", kind="diff", sort=True, base_chain=list(chain)
        )
        writer.commit(cid, [entry], protocol="spark-microbatch")
        chain.append(cid)


def restore(files: list[ChainFile], variant: str, probes: pa.Array) -> dict[str, Any]:
    schema = files[0].table.schema
    table = StateTable(schema, "k")
    chain = [(f.checkpoint, f.kind, f.table) for f in files]
    filters = None if variant == "built" else [f.filter for f in files]
    t0 = time.perf_counter()
    table.restore(chain, mapped=True, filters=filters)
    t1 = time.perf_counter()
    probed = (table.spill_stats() or {}).get("run_probes")
    _, present = table.lookup(probes)
    t2 = time.perf_counter()
    stats = table.spill_stats() or {}
    return {
        "variant": variant,
        "restore_ms": (t1 - t0) * 1000,
        "lookup_ms": (t2 - t1) * 1000,
        "found": int(pc.sum(present).as_py() or 0),
        "diffs_mapped": stats.get("diffs_mapped"),
        "filters_stored": stats.get("filters_stored"),
        "restore_probes": probed,
        "live_keys": len(table),
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}, {max(values):,.0f}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--diffs", type=int, default=6)
    p.add_argument("--diff-keys", type=int, default=500_000)
    p.add_argument("--lookups", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--work", type=Path, default=Path("/tmp/snapcut-filters-bench"))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    chains = {}
    for counts in (False, True):
        name = f"root-{args.keys}-{args.diffs}-{args.diff_keys}" + ("-counted" if counts else "")
        root = args.work / name
        if not (root / "chk-00000001").exists():
            t0 = time.perf_counter()
            write_root(root, args.keys, args.diffs, args.diff_keys, counts)
            print(f"wrote {root} in {time.perf_counter() - t0:.1f} s")
        backend = FsBackend(pa.fs.LocalFileSystem(), str(root))
        chain = backend.chain_files(1 + args.diffs, TASK, mapped=True)
        assert chain is not None and all(
            (f.filter is not None) == (f.kind == "diff") for f in chain
        ), "every diff of the root stores its filter"
        chains[counts] = chain
    files = chains[False]
    blooms = sum(len(f.filter or b"") for f in files)
    diff_bytes = sum(f.table.get_total_buffer_size() for f in files if f.kind == "diff")
    diff_rows = sum(f.table.num_rows for f in files if f.kind == "diff")
    probes = pa.array(np.random.default_rng(3).integers(0, 2 * args.keys, args.lookups))
    runs: list[dict[str, Any]] = []
    load = os.getloadavg()[0]
    for r in range(args.rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            run = {"round": r, **restore(chains[variant == "counted"], variant, probes)}
            runs.append(run)
            print(json.dumps(run))
    by = {v: [x for x in runs if x["variant"] == v] for v in VARIANTS}
    assert len({x["found"] for x in runs}) == 1, "the variants find the same keys"
    assert len({x["live_keys"] for x in runs}) == 1, "the variants count the same live keys"
    assert all((x["restore_probes"] == 0) == (x["variant"] == "counted") for x in runs), runs

    def ratios(a: str, b: str) -> list[float]:
        return [x["restore_ms"] / y["restore_ms"] for x, y in zip(by[a], by[b], strict=True)]

    lines = [
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
        f"1-minute load {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end",
        f"chain: a full of {args.keys:,} keys, {args.diffs} diffs of {diff_rows:,} rows in all "
        f"({diff_bytes / 1e6:,.1f} MB of buffers); stored filters {blooms / 1e6:,.2f} MB "
        f"({blooms / diff_rows:.1f} bytes per diff row)",
        "",
        "| variant | restore ms | lookup of "
        f"{args.lookups:,} keys ms | diffs mapped / filters stored "
        "| keys looked up by the restore | rounds |",
        "|---|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        xs = by[v]
        lines.append(
            f"| {v} | {spread([x['restore_ms'] for x in xs])} | "
            f"{spread([x['lookup_ms'] for x in xs])} | "
            f"{xs[0]['diffs_mapped']} / {xs[0]['filters_stored']} | "
            f"{xs[0]['restore_probes']:,} | {len(xs)} |"
        )
    lines.append("")
    for a, b in (("stored", "built"), ("counted", "stored")):
        rs = ratios(a, b)
        lines.append(
            f"{a} / {b} restore time, per round: median {statistics.median(rs):.2f} "
            f"[{min(rs):.2f}, {max(rs):.2f}]"
        )
    print("\n".join(lines))
    if args.out:
        write_results(args.out, runs, lines)


if __name__ == "__main__":
    main()
