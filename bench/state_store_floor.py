"""ABS at large state next to its floor (issue 37): how far above the bare
cost of writing its state the checkpoint path is.

Per round, in ABBA order: the experiments' three-shuffle job
(`snapcut.experiments.flows.build`, 2 tasks per operator) without
checkpoints (`none`) and with durable aligned checkpoints every INTERVAL s
(`aligned`); after each aligned run, its **floor**: the same checkpoints'
state written alone, nothing else running. The floor replays every periodic
checkpoint of that run with the runtime's own pieces:

- the state: the job's two user-keyed stages hold the keys, 2 tasks each,
  so four `StateTable`s (`user, count, total`: Int64) of keys / 2 rows;
- between checkpoints, each table gets as many rows rewritten (random keys,
  not timed: that is the job's work) as the run's checkpoint captured
  (`CheckpointMetrics.state_bytes` over a captured row's bytes, split over
  the four tables; the small dwell-keyed stage is left out);
- **capture** (timed): `StateTable.checkpoint`, the synchronous phase a
  task runs (a diff of the changed rows: a durable run captures only diffs);
- **write** (timed): `SnapshotStore.task_snapshot` of the four captures and
  `commit`: Arrow IPC encoding, checksums, files, fsync and the manifest,
  through the store a durable run writes with (its compactor included).

The sort is not in it: captures are stored in their own order, and the
compactor sorts when it merges (`store/format/compaction.rs`).

Prints each run and per round the overhead (aligned - none, seconds and %)
beside the floor (capture + write seconds, and as a share of `none`), then
medians. The job keeps both cores busy, so a second of floor work on either
core costs the job about half a second to a second of runtime.

    python bench/state_store_floor.py --keys 10000000 --records 100000000 --rounds 3 \
        --out bench/results/state_store/floor/10m-keys.json

Run it with the project's venv python, nothing else running.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from snapcut import Checkpointing, StateTable
from snapcut._core import SnapshotStore
from snapcut.experiments.flows import build

TABLES = 4
"""Stateful tasks holding the user keys: stage1 and stage3, 2 tasks each."""
SCHEMA = pa.schema([("user", pa.int64()), ("count", pa.int64()), ("total", pa.int64())])
NEVER_FULL = 2**31
"""A durable run's tasks capture only diffs; the compactor makes fulls."""


def rows(keys: np.ndarray, rng: np.random.Generator) -> pa.RecordBatch:
    n = len(keys)
    return pa.record_batch(
        [
            pa.array(keys, pa.int64()),
            pa.array(rng.integers(1, 1_000, n), pa.int64()),
            pa.array(rng.integers(1, 100_000, n), pa.int64()),
        ],
        schema=SCHEMA,
    )


def floor(keys: int, captured_bytes: list[int], seed: int) -> dict[str, Any]:
    """Replays checkpoints that captured `captured_bytes` each: per table,
    rewrites that share of rows, then times the capture and the write."""
    rng = np.random.default_rng(seed)
    # Table t is task t % 2 of its stage: every other key.
    owned = [np.arange(t % 2, keys, 2, dtype=np.int64) for t in range(TABLES)]
    tables = [StateTable(SCHEMA, "user", full_every=NEVER_FULL) for _ in range(TABLES)]
    root = tempfile.mkdtemp(prefix="snapcut-floor-")
    try:
        store = SnapshotStore(root, retain=3)
        for t, table in enumerate(tables):
            table.update(rows(owned[t], rng))
        cid = 1
        for t, table in enumerate(tables):
            _, kind, batch = table.checkpoint(cid)
            store.task_snapshot(cid, "stage", t, state=(kind, None, batch))
        store.commit(cid)
        # A captured row's bytes: a diff of a few rows of the same schema.
        probe = tables[0]
        probe.update(rows(owned[0][:4000], rng))
        row_bytes = probe.diff().nbytes / probe.changed
        capture_s: list[float] = []
        write_s: list[float] = []
        changed: list[int] = []
        for b in captured_bytes:
            cid += 1
            n = max(int(b / row_bytes / TABLES), 1)
            for t, table in enumerate(tables):
                table.update(rows(rng.choice(owned[t], min(n, len(owned[t])), replace=False), rng))
            t0 = time.perf_counter()
            captures = [table.checkpoint(cid) for table in tables]
            t1 = time.perf_counter()
            for t, (_, kind, batch) in enumerate(captures):
                base = None if kind == "full" else cid - 1
                store.task_snapshot(cid, "stage", t, state=(kind, base, batch))
            store.commit(cid)
            t2 = time.perf_counter()
            capture_s.append(t1 - t0)
            write_s.append(t2 - t1)
            changed.append(sum(c[2].num_rows for c in captures))
        return {
            "row_bytes": row_bytes,
            "checkpoints": len(captured_bytes),
            "rows_per_checkpoint_median": statistics.median(changed) if changed else 0,
            "capture_s": sum(capture_s),
            "write_s": sum(write_s),
            "capture_ms_median": statistics.median(capture_s) * 1e3 if capture_s else 0,
            "write_ms_median": statistics.median(write_s) * 1e3 if write_s else 0,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(case: str, keys: int, records: int, interval: float) -> dict[str, Any]:
    flow = build(records=records, keys=keys, parallelism=2)
    if case == "none":
        return {"seconds": flow.run(checkpointing=Checkpointing(protocol="none")).duration_s}
    root = tempfile.mkdtemp(prefix="snapcut-floor-run-")
    try:
        cp = Checkpointing(protocol="aligned", interval=interval)
        rep = flow.run(checkpointing=cp, checkpoint_dir=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    done = [c for c in rep.completed_checkpoints if not c.is_final]
    ms = [c.duration_s * 1e3 for c in done]
    return {
        "seconds": rep.duration_s,
        "checkpoints": len(done),
        "checkpoint_ms_median": statistics.median(ms) if ms else None,
        "checkpoint_ms_max": max(ms, default=None),
        "captured_bytes": [c.state_bytes for c in done],
        "store_bytes_written": sum(c.store.bytes_written for c in done if c.store),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--keys", type=int, required=True)
    p.add_argument("--records", type=int, required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    rounds: list[dict[str, Any]] = []
    for r in range(a.rounds):
        got: dict[str, Any] = {}
        for case in ("none", "aligned") if r % 2 == 0 else ("aligned", "none"):
            got[case] = run(case, a.keys, a.records, a.interval)
            print(f"round {r} {case:8s} {got[case]['seconds']:7.2f} s", flush=True)
        got["floor"] = floor(a.keys, got["aligned"]["captured_bytes"], seed=r)
        none_s, aligned_s = got["none"]["seconds"], got["aligned"]["seconds"]
        fl = got["floor"]
        floor_s = fl["capture_s"] + fl["write_s"]
        got["overhead_s"] = aligned_s - none_s
        got["overhead"] = aligned_s / none_s - 1
        got["floor_s"] = floor_s
        got["floor_share"] = floor_s / none_s
        print(
            f"round {r}: overhead {got['overhead_s']:+.2f} s ({got['overhead']:+.1%}); "
            f"floor {floor_s:.2f} s ({got['floor_share']:.1%} of none) = capture "
            f"{fl['capture_s']:.2f} s + write {fl['write_s']:.2f} s over "
            f"{fl['checkpoints']} checkpoints of ~{fl['rows_per_checkpoint_median']:,.0f} rows",
            flush=True,
        )
        rounds.append(got)

    def med(k: str) -> float:
        return statistics.median(x[k] for x in rounds)

    def span(k: str) -> str:
        v = [x[k] for x in rounds]
        return f"[{min(v):+.3f}, {max(v):+.3f}]"

    print(
        f"median: overhead {med('overhead'):+.1%} {span('overhead')}, "
        f"{med('overhead_s'):+.2f} s; floor {med('floor_s'):.2f} s "
        f"({med('floor_share'):.1%} of none) {span('floor_share')}"
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    for x in rounds:
        x["aligned"].pop("captured_bytes")
    a.out.write_text(
        json.dumps({"args": vars(a) | {"out": str(a.out)}, "rounds": rounds}, indent=1)
    )


if __name__ == "__main__":
    main()
