"""Bytes written per checkpoint by the Python keyed process: diff vs full.

One keyed-process operator (`key_by("k").process(fn)`, state a small dict
per key) is driven directly through the private hook
`_core._keyed_checkpoints`: checkpoint 1 after KEYS keys, then between
checkpoints CHANGED_PCT % of the keys change (90 % updated, 10 % dropped →
tombstones). Every capture goes through the real durable store
(`SnapshotStore`: Arrow IPC file, crc32c, manifest); the bytes are the
manifest's file sizes. `full_every` = 11: checkpoint 1 and 12 are full,
2..11 diffs. Sync-phase times (`Operator::snapshot`, what the task waits
for) are medians within one run; "pickle every key" is what the previous
implementation did at every checkpoint, measured as pickle.dumps of as many
state dicts (a proxy: it omits building the Arrow arrays).

Rerun: python bench/keyed_state_bytes.py   (env: KEYS=100000 CHANGED_PCT=1)
"""

from __future__ import annotations

import json
import os
import pickle
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from snapcut import _core

KEYS = int(os.environ.get("KEYS", "100000"))
CHANGED_PCT = float(os.environ.get("CHANGED_PCT", "1"))
FULL_EVERY = 11
CHECKPOINTS = 12


def fn(key: int, rows: pa.RecordBatch, state: dict[str, int] | None) -> tuple[None, Any]:
    vs = rows["v"].to_pylist()
    if any(v < 0 for v in vs):
        return None, None
    state = state or {"n": 0, "sum": 0}
    return None, {"n": state["n"] + len(vs), "sum": state["sum"] + sum(vs)}


def steps(seed: int = 7) -> list[list[pa.RecordBatch]]:
    rng = random.Random(seed)
    live = list(range(KEYS))
    out = [[pa.RecordBatch.from_pydict({"k": live, "v": [1] * KEYS})]]
    per_step = max(1, int(KEYS * CHANGED_PCT / 100))
    for _ in range(CHECKPOINTS - 1):
        picked = rng.sample(live, per_step)
        dropped = set(picked[: per_step // 10])
        v = [-1 if k in dropped else 1 for k in picked]
        live = [k for k in live if k not in dropped]
        out.append([pa.RecordBatch.from_pydict({"k": picked, "v": v})])
    return out


def run(full_every: int, root: Path) -> tuple[list[int], list[tuple[str, int, int]]]:
    data = steps()
    timings: list[int] = []
    caps = _core._keyed_checkpoints("k", fn, data, full_every, timings=timings)
    store = _core.SnapshotStore(str(root), retain=CHECKPOINTS + 1)
    out = []
    for cid, cap in enumerate(caps, start=1):
        store.task_snapshot(cid, "keyed", 0, state=cap)
        store.commit(cid)
        manifest = json.loads((root / f"chk-{cid:08d}" / "manifest.json").read_text())
        (f,) = [f for f in manifest["files"] if f["role"] == "state"]
        out.append((f["kind"], f["rows"], f["bytes"]))
    return timings, out


def pickle_every_key_ms() -> float:
    states = [{"n": i % 7 + 1, "sum": i % 7 + 1} for i in range(KEYS)]
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        [pickle.dumps(s) for s in states]
        runs.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(runs)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t_inc, inc = run(FULL_EVERY, Path(tmp) / "inc")
        _, full = run(1, Path(tmp) / "full")
    fulls = [b for k, _, b in inc if k == "full"]
    diffs = [b for k, _, b in inc if k == "diff"]
    diff_rows = [r for k, r, _ in inc if k == "diff"]
    assert [k for k, _, _ in inc] == ["full"] + ["diff"] * 10 + ["full"], inc
    assert all(k == "full" for k, _, _ in full)
    full_med, diff_med = statistics.median(fulls), statistics.median(diffs)
    print(f"keys={KEYS} changed={CHANGED_PCT}% per checkpoint, full_every={FULL_EVERY}")
    print(f"full checkpoint: median {full_med:,.0f} bytes")
    print(
        f"diff checkpoint: median {diff_med:,.0f} bytes ({statistics.median(diff_rows):.0f} rows)"
    )
    print(f"diff / full bytes: {100 * diff_med / full_med:.2f} %")
    inc_total = sum(b for _, _, b in inc)
    full_total = sum(b for _, _, b in full)
    print(
        f"{CHECKPOINTS} checkpoints, bytes: incremental {inc_total:,} vs all-full "
        f"{full_total:,} ({full_total / inc_total:.1f}x)"
    )
    kinds = [k for k, _, _ in inc]
    sync_diff = statistics.median(t for t, k in zip(t_inc, kinds, strict=True) if k == "diff")
    sync_full = statistics.median(
        t for t, k in zip(t_inc[1:], kinds[1:], strict=True) if k == "full"
    )
    print(
        f"sync phase: diff {sync_diff / 1e6:.2f} ms, full (checkpoint 12) {sync_full / 1e6:.2f} ms"
    )
    print(f"first checkpoint (pickles every key): {t_inc[0] / 1e6:.1f} ms")
    old = pickle_every_key_ms()
    print(f"pickle every key (previous implementation, every checkpoint): {old:.1f} ms")


if __name__ == "__main__":
    main()
