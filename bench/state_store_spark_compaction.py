"""A Spark state partition's commits with its full written in the commit
against merged off the task's path by the worker's compactor (issue 37: "No
rebuild at commit: `full_every` rebuilds leave the commit path").

One process plays the Python worker that runs one state partition of
``keyed_state(...).aggregate(count, sum)``, with the Spark helper's own
pieces (``PartitionTask``, ``AggregateProcessor``, a warm ``StateCache``):
batch 0 creates KEYS keys, then BATCHES batches of BATCH_ROWS rows over
random keys, back to back (``trigger(availableNow=True)``). ``commit_full``
is ``keyed_state(compaction=False)``: every FULL_EVERY-th commit writes the
partition whole. ``compactor`` is the default: every commit writes a diff,
the worker's compactor merges the runs on its own thread once FULL_EVERY
diffs sit on the full, and a later commit adopts the merge. Per batch: the
apply's and the commit's wall time, the file kind, the merges adopted. Then
a task that does not hold the partition loads it cold from what the last
batch left. The variants alternate (ABBA), each round on a fresh root.

A second table: the manifest's size, the one cost runs listed in every
entry add (a ``keyed_state`` of PARTITIONS partitions and few keys, each
variant after three times FULL_EVERY batches).

``--root s3``: the root in a bucket of moto's S3 server (its own process on
127.0.0.1), the worker's run cache in the work directory; ``compactor`` is
the remote root's (its inputs fetched through the run cache, each merge
stored in the checkpoint of the newest run it merged). The cold load reads
through a run cache of its own, empty (a worker on another machine).

    python bench/state_store_spark_compaction.py --keys 10000000 --batches 12 \\
        --batch-rows 1000000 --full-every 4 --rounds 4 \\
        --out bench/results/state_store/spark_compaction
    python bench/state_store_spark_compaction.py --root s3 --keys 2000000 \\
        --batches 12 --batch-rows 200000 --full-every 4 --rounds 4 \\
        --manifest-partitions 0 --out bench/results/state_store/spark_compaction_s3
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from children import spread, write_results
from snapcut._core import KeyedAggregates
from snapcut.snapshots.run_cache import RunCacheSpec, shared
from snapcut.spark.processors import AggregateProcessor
from snapcut.spark.roots import schema_bytes
from snapcut.spark.state.compaction import WorkerCompactor
from snapcut.spark.state.partition import PartitionTask
from snapcut.spark.state.remote_compaction import RemoteCompactor
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import RootSpec
from snapcut.spark.state.warm import StateCache

VARIANTS = ("commit_full", "compactor")
INPUT = pa.schema([("user", pa.int64()), ("v", pa.int64())])
SPECS = [("count", None, "n"), ("sum", "v", "total")]
DRAIN_S = 600.0
MOTO_START_S = 120.0
ACCESS_KEY, SECRET_KEY, REGION = "snapcut", "snapcut-secret", "us-east-1"


@contextlib.contextmanager
def moto_process() -> Iterator[pafs.S3FileSystem]:
    """moto's S3 server in a process of its own (not a thread of this one:
    it would take the GIL from the worker being measured)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        fs = pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            allow_bucket_creation=True,
            allow_bucket_deletion=True,
        )
        deadline = time.monotonic() + MOTO_START_S
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto did not answer within {MOTO_START_S} s") from None
                time.sleep(0.2)
        yield fs
    finally:
        server.terminate()
        server.wait(30)


def spec(
    root: Path, partitions: int, full_every: int, compaction: bool, args: argparse.Namespace
) -> RootSpec:
    local = RootSpec(
        uri=str(root),
        vertex="state",
        partitions=partitions,
        key=("user",),
        state_key="user",
        state_schema=schema_bytes(KeyedAggregates(INPUT, "user", SPECS).state_schema),
        full_every=full_every,
        retain=10,
        compaction=compaction,
    )
    if args.root == "local":
        return local
    bucket = f"bench-{uuid.uuid4().hex[:12]}"
    args.s3.create_dir(bucket)
    return dataclasses.replace(
        local,
        uri=f"{bucket}/root",
        filesystem=args.s3,
        run_cache=RunCacheSpec(str(root.parent / f"cache-{bucket}"), 64 << 30),
    )


def compactor(s: RootSpec) -> WorkerCompactor:
    """The worker's compactor of the variant's root: a local root's, or a
    remote root's (its inputs through the run cache)."""
    root = StateRoot(s)
    if s.filesystem is None:
        return WorkerCompactor(root.path)
    cache = shared(s.run_cache)
    assert cache is not None, "a remote root's compactor needs the run cache"
    return RemoteCompactor(root.fs, root.path, cache)


def discard(s: RootSpec) -> None:
    """Removes a variant's root (and a remote one's run caches)."""
    if s.filesystem is None:
        shutil.rmtree(s.uri, ignore_errors=True)
        return
    s.filesystem.delete_dir(s.uri.split("/", 1)[0])
    for cache in Path(str(s.run_cache.directory)).parent.glob("cache-*"):
        shutil.rmtree(cache, ignore_errors=True)


def processor() -> AggregateProcessor:
    kernel = KeyedAggregates(INPUT, "user", SPECS)
    return AggregateProcessor(
        key=("user",),
        state_key="user",
        state_schema=kernel.state_schema,
        output_schema=pa.schema([("user", pa.int64()), ("n", pa.int64()), ("total", pa.int64())]),
        specs=SPECS,
    )


def batch_rows(b: int, args: argparse.Namespace, rng: np.random.Generator) -> pa.Table:
    users = (
        np.arange(args.keys, dtype=np.int64)
        if b == 0
        else rng.integers(0, args.keys, args.batch_rows, dtype=np.int64)
    )
    return pa.table({"user": users, "v": rng.integers(0, 10_000, len(users))}, schema=INPUT)


def one(root: Path, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """One variant's batches on a fresh root, then a cold load."""
    shutil.rmtree(root, ignore_errors=True)
    merged = variant == "compactor"
    s = spec(root, 1, args.full_every, merged, args)
    StateRoot(s).init("aggregate")
    wc = compactor(s) if merged else None
    cache = StateCache(4)
    rng = np.random.default_rng(11)
    batches = []
    t_all = time.perf_counter()
    for b in range(1 + args.batches):
        data = batch_rows(b, args, rng)
        task = PartitionTask(StateRoot(s), b, 0, "q1", None, cache=cache, compactor=wc or False)
        t0 = time.perf_counter()
        task.apply(data, processor(), None)
        t1 = time.perf_counter()
        task.commit()
        t2 = time.perf_counter()
        f = task.figures()
        batches.append(
            {
                "batch": b,
                "apply_s": t1 - t0,
                "commit_s": t2 - t1,
                "full": f["state_fulls_written"],
                "adopted": f["state_compactions_adopted"],
                "bytes": f["state_bytes_written"],
            }
        )
        del data, task
    wall = time.perf_counter() - t_all
    stats: dict[str, Any] = {}
    if wc is not None:
        assert wc.flush(DRAIN_S), "the compactor drained"
        stats = wc.stats()
        wc.close()
    last = args.batches
    manifest = StateRoot(s).manifest(last)
    assert manifest is not None
    (entry,) = [f for f in manifest["files"] if f["role"] == "state"]
    # A worker on another machine: a run cache of its own, empty.
    cold_spec = s
    if s.filesystem is not None:
        cold_spec = dataclasses.replace(
            s, run_cache=RunCacheSpec(f"{s.run_cache.directory}-cold", 64 << 30)
        )
    cold = PartitionTask(
        StateRoot(cold_spec), last + 1, 0, "q1", None, cache=StateCache(0), compactor=False
    )
    t0 = time.perf_counter()
    loaded = cold.load()
    cold_s = time.perf_counter() - t0
    rows = sum(len(t) for t in loaded.tables.values())
    del loaded, cold
    discard(s)
    later = batches[1:]
    return {
        "variant": variant,
        "wall_s": wall,
        "commit_s_median": statistics.median(x["commit_s"] for x in later),
        "commit_s_max": max(x["commit_s"] for x in later),
        "commit_s_total": sum(x["commit_s"] for x in later),
        "apply_s_total": sum(x["apply_s"] for x in later),
        "fulls_after_0": sum(x["full"] for x in later),
        "adopted": sum(x["adopted"] for x in later),
        "runs_at_end": len(entry.get("runs") or entry["chain"]),
        "cold_load_s": cold_s,
        "state_rows": rows,
        "compactor_busy_s": stats.get("busy_s", 0.0),
        "compactor_mb_written": stats.get("bytes_written", 0) / 1e6,
        "batches": batches,
    }


def manifest_sizes(work: Path, args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    """The newest manifest's bytes after three times full_every batches of a root of
    `--manifest-partitions` partitions, each variant: as written, and (the
    same JSON encoder for both) with and without its entries' runs, what a
    format 1 entry (its chain alone) would take."""
    out = {}
    for variant in VARIANTS:
        root = work / f"manifest-{variant}"
        shutil.rmtree(root, ignore_errors=True)
        s = spec(root, args.manifest_partitions, args.full_every, variant == "compactor", args)
        StateRoot(s).init("aggregate")
        wc = compactor(s) if variant == "compactor" else None
        rng = np.random.default_rng(5)
        last = 3 * args.full_every
        for b in range(last + 1):
            for p in range(args.manifest_partitions):
                users = rng.integers(0, 1000, 20, dtype=np.int64) * args.manifest_partitions + p
                data = pa.table({"user": users, "v": users}, schema=INPUT)
                task = PartitionTask(
                    StateRoot(s), b, p, "q1", None, cache=StateCache(0), compactor=wc or False
                )
                task.run(data, processor(), None)
            if wc is not None:
                assert wc.flush(DRAIN_S)
        manifest = StateRoot(s).manifest(last)
        assert manifest is not None
        chains_only = {
            **manifest,
            "files": [{k: v for k, v in f.items() if k != "runs"} for f in manifest["files"]],
        }
        out[variant] = (len(json.dumps(manifest)), len(json.dumps(chains_only)))
        if wc is not None:
            wc.close()
        discard(s)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--batch-rows", type=int, default=1_000_000)
    p.add_argument("--full-every", type=int, default=4)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--manifest-partitions", type=int, default=200, help="0: no manifest size table")
    p.add_argument("--root", choices=("local", "s3"), default="local")
    p.add_argument("--work", type=Path, default=Path("/tmp/snapcut-spark-compaction-bench"))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    with contextlib.ExitStack() as stack:
        args.s3 = stack.enter_context(moto_process()) if args.root == "s3" else None
        measure(args)


def measure(args: argparse.Namespace) -> None:
    runs: list[dict[str, Any]] = []
    load = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    for r in range(args.rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            run = {"round": r, **one(args.work / "root", variant, args)}
            runs.append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "batches"}), flush=True)
    sizes = manifest_sizes(args.work, args) if args.manifest_partitions else {}
    shutil.rmtree(args.work, ignore_errors=True)
    assert len({x["state_rows"] for x in runs}) == 1, "every run holds the same keys"
    by = {v: [x for x in runs if x["variant"] == v] for v in VARIANTS}
    lines = [
        f"{started}; machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs; 1-minute load {load:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end; {' '.join(sys.argv)}",
        f"root: {args.root}"
        + (" (moto's S3 server, its own process on 127.0.0.1)" if args.root == "s3" else ""),
        f"one partition: batch 0 creates {args.keys:,} keys, then {args.batches} batches of "
        f"{args.batch_rows:,} random keys, full_every={args.full_every}; "
        f"then a cold load",
        "",
        "| variant | commit s (median) | commit s (max) | commits s (sum) | applies s (sum) "
        "| wall s | fulls in commits | merges adopted | runs at end | cold load s "
        "| compactor busy s | rounds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        xs = by[v]
        lines.append(
            f"| {v} | {spread([x['commit_s_median'] for x in xs], '.3f')} "
            f"| {spread([x['commit_s_max'] for x in xs], '.3f')} "
            f"| {spread([x['commit_s_total'] for x in xs], '.2f')} "
            f"| {spread([x['apply_s_total'] for x in xs], '.2f')} "
            f"| {spread([x['wall_s'] for x in xs], '.1f')} "
            f"| {spread([x['fulls_after_0'] for x in xs], '.0f')} "
            f"| {spread([x['adopted'] for x in xs], '.0f')} "
            f"| {spread([x['runs_at_end'] for x in xs], '.0f')} "
            f"| {spread([x['cold_load_s'] for x in xs], '.2f')} "
            f"| {spread([x['compactor_busy_s'] for x in xs], '.2f')} | {len(xs)} |"
        )
    lines.append("")
    for field in ("commit_s_max", "commit_s_total", "wall_s", "cold_load_s"):
        rs = [c[field] / f[field] for c, f in zip(by["compactor"], by["commit_full"], strict=True)]
        lines.append(
            f"compactor / commit_full {field}, per round: median {statistics.median(rs):.2f} "
            f"[{min(rs):.2f}, {max(rs):.2f}]"
        )
    if sizes:
        lines += [
            "",
            f"manifest bytes after {3 * args.full_every} batches, "
            f"{args.manifest_partitions} partitions: "
            + ", ".join(f"{v} {n:,} (without the runs: {m:,})" for v, (n, m) in sizes.items()),
        ]
    print("\n".join(lines))
    if args.out:
        write_results(args.out, runs, lines)


if __name__ == "__main__":
    main()
