"""A cold Spark state task on a remote root, with and without the run cache
(issue 37), measured without Spark: the same task code
(`snapcut.spark.state.partition.PartitionTask`) on an S3 root served by moto
on 127.0.0.1 (the tests' server, `tests/s3_support.py`).

Prepared once: a root of one partition of KEYS keys (`count` and `sum` per
key, the level-1 aggregate) written by batch 0 (a full) and batch 1 (a diff
of DIFF keys), under `state_memory=BUDGET`. Each measured run is a child
process that runs batch 2 of the partition cold (no table in its worker),
which reads the chain from S3:

- `no-cache`: the run cache off (`run_cache_size=0`): the files are read into
  memory and the budgeted table copies its base into a local run;
- `cache-cold`: an empty cache directory: each file downloaded into it,
  checked, and mapped; the table takes the full as its base run as it is;
- `cache-warm`: the directory as the cold run left it: nothing downloaded.

Per run: the task's load time (`state_load_ms_max`: read and restore), its
whole time, the bytes fetched into the cache, VmHWM and the largest RssAnon
seen (sampled every 20 ms). The child is killed after its task, so no
commit of batch 2 stays: every run reads the same chain. Rounds alternate
the order (ABC, CBA). Writes ``<out>/runs.jsonl`` and prints a table.

    python bench/state_store_remote_cold.py --keys 5000000 --rounds 3 \\
        --out bench/results/state_store/remote_cold
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from children import child_env, run_json_child, spread

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, os, pickle, sys, time
import pyarrow as pa
from children import MemoryPeaks

spec_file, cache_dir, cache_size, budget, diff = sys.argv[1:6]
peaks = MemoryPeaks()
import dataclasses
from snapcut.snapshots.run_cache import RunCacheSpec
from snapcut.spark.state.partition import PartitionTask
from snapcut.spark.state.warm import StateCache
from snapcut.spark.state.root import StateRoot

with open(spec_file, "rb") as f:
    spec, processor = pickle.load(f)
spec = dataclasses.replace(spec, run_cache=RunCacheSpec(cache_dir, int(cache_size)))
users = list(range(0, int(diff)))
data = pa.table({"user": pa.array(users, pa.int64()), "v": pa.array([3] * len(users), pa.int64())})
t0 = time.monotonic()
task = PartitionTask(
    StateRoot(spec), 2, 0, "bench", None, cache=StateCache(0), state_memory=int(budget)
)
task.apply(data, processor, None)
task_s = time.monotonic() - t0
memory = peaks.stop()
loaded = task._loaded
stats = loaded.tables["state"].spill_stats() or {}
print(json.dumps({
    "task_s": round(task_s, 3),
    "load_ms": round(loaded.load_ms),
    "bytes_read": loaded.bytes_read,
    "run_cache_hits": loaded.run_cache_hits,
    "run_cache_misses": loaded.run_cache_misses,
    "bytes_fetched": loaded.run_cache_bytes_fetched,
    "bases_mapped": stats.get("bases_mapped", 0),
    **memory,
}), flush=True)
os._exit(0)  # no commit of batch 2: every run reads the same chain
"""


def prepare(s3: Any, args: argparse.Namespace, work: Path) -> Path:
    """Batches 0 and 1 of one partition on a new bucket; returns the pickled
    (spec, processor) the children use."""
    import pyarrow as pa

    from snapcut._core import KeyedAggregates
    from snapcut.snapshots.run_cache import RunCacheSpec
    from snapcut.spark.processors import AggregateProcessor
    from snapcut.spark.roots import schema_bytes
    from snapcut.spark.state.partition import PartitionTask
    from snapcut.spark.state.root import StateRoot
    from snapcut.spark.state.spec import RootSpec
    from snapcut.spark.state.warm import StateCache

    schema = pa.schema([("user", pa.int64()), ("v", pa.int64())])
    specs = [("count", None, "n"), ("sum", "v", "total")]
    kernel = KeyedAggregates(schema, "user", specs)
    spec = RootSpec(
        uri=f"{s3.bucket()}/state",
        vertex="state",
        partitions=1,
        key=("user",),
        state_key="user",
        state_schema=schema_bytes(kernel.state_schema),
        full_every=100,
        retain=10,
        filesystem=s3.filesystem(),
        run_cache=RunCacheSpec(None, 0),
    )
    processor = AggregateProcessor(
        key=("user",),
        state_key="user",
        state_schema=kernel.state_schema,
        output_schema=pa.schema([("user", pa.int64()), ("n", pa.int64()), ("total", pa.int64())]),
        specs=specs,
    )
    StateRoot(spec).init("aggregate")
    budget = int(args.budget)
    cache = StateCache(0)
    for batch, users in enumerate(
        [range(args.keys - 1, -1, -1), range(0, args.keys, args.keys // args.diff)]
    ):
        data = pa.table(
            {
                "user": pa.array(users, pa.int64()),
                "v": pa.array([batch + 1] * len(users), pa.int64()),
            }
        )
        task = PartitionTask(
            StateRoot(spec), batch, 0, "bench", None, cache=cache, state_memory=budget
        )
        task.run(data, processor, None)
    out = work / "spec.pickle"
    with open(out, "wb") as f:
        pickle.dump((spec, processor), f)
    return out


def child(
    spec_file: Path, cache_dir: Path, cache_size: int, args: argparse.Namespace
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-c",
        CHILD,
        str(spec_file),
        str(cache_dir),
        str(cache_size),
        str(args.budget),
        str(args.diff),
    ]
    return run_json_child(cmd, child_env(""), args.timeout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--keys", type=int, default=5_000_000)
    p.add_argument("--diff", type=int, default=100_000, help="keys batch 1 and 2 change")
    p.add_argument("--budget", type=int, default=256 << 20, help="state_memory, bytes")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from tests.s3_support import moto_server

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="snapcut-remote-cold-"))
    rows: list[dict[str, Any]] = []
    try:
        with moto_server() as s3:
            t0 = time.monotonic()
            spec_file = prepare(s3, args, work)
            prepared_s = round(time.monotonic() - t0, 1)
            print(json.dumps({"prepared_s": prepared_s}), flush=True)
            with open(out / "runs.jsonl", "w") as f:
                f.write(json.dumps({"args": vars(args), "prepared_s": prepared_s}) + "\n")
                for rnd in range(args.rounds):
                    cache = work / f"cache-{rnd}"
                    order = ["no-cache", "cache-cold", "cache-warm"]
                    if rnd % 2:
                        # cache-warm needs the cold run's files: the no-cache
                        # run moves instead.
                        order = ["cache-cold", "cache-warm", "no-cache"]
                    for case in order:
                        size = 0 if case == "no-cache" else 1 << 40
                        load = os.getloadavg()[0]
                        row = child(spec_file, cache, size, args)
                        row |= {"case": case, "round": rnd, "load_1m": round(load, 2)}
                        print(json.dumps(row), flush=True)
                        f.write(json.dumps(row) + "\n")
                        f.flush()
                        rows.append(row)
                        time.sleep(1)
                    shutil.rmtree(cache, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(
        "| case | load, ms | task, s | fetched, MB | VmHWM, MB | RssAnon peak, MB | base mapped |"
    )
    print("|---|---|---|---|---|---|---|")
    for case in ("no-cache", "cache-cold", "cache-warm"):
        mine = [r for r in rows if r["case"] == case]
        cells = [
            spread([r["load_ms"] for r in mine]),
            spread([r["task_s"] for r in mine]),
            spread([round(r["bytes_fetched"] / 2**20) for r in mine]),
            spread([r["vm_hwm_mb"] for r in mine]),
            spread([r["rss_anon_peak_mb"] for r in mine]),
            spread([r["bases_mapped"] for r in mine]),
        ]
        print(f"| {case} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
