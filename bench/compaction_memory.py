"""What a base merge costs the process it runs in (issue 37): memory and time.

A task's state in a durable `SnapshotStore`, written once: a full of KEYS
rows (`user, count, total`: Int64) and two diffs of DIFF_KEYS random keys
each (no compaction). Each run is a child process on a copy of that root
that holds no state of its own: it opens the store with
`materialize_every=2` and commits a one-row diff, which hands the compactor
a base merge of the chain (the diffs hold more than a quarter of the full's
rows), and waits for the merge, sampling RssAnon and VmRSS every 10 ms.
Reported: the peaks above the child's memory before the commit, the wall
time from the commit to the merge's end, and the compactor's own busy time.

Variants: `sorted` (the full's rows in key order, as a budgeted table or a
compaction writes it) and `shuffled` (in capture order, as an in-memory
aggregate writes its fulls: the merge sorts a copy).

Two builds side by side (`--a`/`--b`: a directory to put first on
PYTHONPATH, "" for the installed one), rounds in opposite orders:

    python bench/compaction_memory.py --a /work/ab-old/python --b "" \\
        --keys 10000000 --diff-keys 2000000 --rounds 3 \\
        --out bench/results/state_store/compaction_memory

With `--cpu-share 0.5` (the store's `compaction_cpu_share`) it shows where the
budget's rest falls: within the merge (before the output is handed over, so
in commit -> merged) or after it.

Run it with the project's venv python, nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

VARIANTS = ("sorted", "shuffled")
WAIT_S = 600.0
"""The longest a merge is waited for (a 10M-key base merge takes seconds)."""


def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def prepare(root: str, keys: int, diff_keys: int, variant: str) -> None:
    """Writes checkpoints 1-3 of task agg-0 under `root`: a full of `keys`
    rows and two diffs of `diff_keys` each, with no compaction."""
    import numpy as np

    from snapcut import StateTable
    from snapcut._core import SnapshotStore

    # The same rows as the floor bench's captures (its aggregate's schema).
    from state_store_floor import SCHEMA, rows

    rng = np.random.default_rng(7)

    users = np.arange(keys, dtype=np.int64)
    if variant == "shuffled":
        rng.shuffle(users)
    store = SnapshotStore(root, retain=10, materialize_every=1_000)
    table = StateTable(SCHEMA, "user", full_every=2**31)
    table.update(rows(users, rng))
    for cid in (1, 2, 3):
        _, kind, batch = table.checkpoint(cid)
        store.task_snapshot(cid, "agg", 0, state=(kind, None if cid == 1 else cid - 1, batch))
        store.commit(cid)
        table.update(rows(rng.choice(keys, diff_keys, replace=False), rng))


def child(root: str, cpu_share: float) -> dict[str, Any]:
    """Commits a one-row diff on the prepared chain in a process that holds
    no state: the commit hands the compactor the base merge, measured."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from snapcut._core import SnapshotStore

    with ipc.open_file(Path(root) / "chk-00000003" / "agg-0.state.arrow") as f:
        schema = f.schema
    one = pa.record_batch(
        [pa.array([False] if f.name == "__deleted" else [0], f.type) for f in schema],
        schema=schema,
    )
    store = SnapshotStore(root, retain=10, materialize_every=2, compaction_cpu_share=cpu_share)
    store.task_snapshot(4, "agg", 0, state=("diff", 3, one))
    start_anon = status_kb("RssAnon")
    start_rss = status_kb("VmRSS")
    peaks = {"anon": start_anon, "rss": start_rss}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peaks["anon"] = max(peaks["anon"], status_kb("RssAnon"))
            peaks["rss"] = max(peaks["rss"], status_kb("VmRSS"))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    store.commit(4)
    idle = store.wait_for_compactions(WAIT_S)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    stats = store.compaction_stats()
    if not idle or stats["merged"] < 1 or stats["failed"]:
        raise RuntimeError(f"the base merge did not finish: {stats}")
    return {
        "commit_to_merged_s": wall,
        "busy_s": stats["busy_s"],
        "rested_s": stats["rested_s"],
        "anon_peak_mb": (peaks["anon"] - start_anon) / 1024,
        "rss_peak_mb": (peaks["rss"] - start_rss) / 1024,
        "bytes_read_mb": stats["bytes_read"] / 1e6,
        "bytes_written_mb": stats["bytes_written"] / 1e6,
    }


def run_child(path: str, root: str, cpu_share: float) -> dict[str, Any]:
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = path + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, __file__, "--child", root, "--cpu-share", str(cpu_share)]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"child failed ({out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", default="", help="PYTHONPATH entry of build A ('' = installed)")
    p.add_argument("--b", default="", help="PYTHONPATH entry of build B ('' = installed)")
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--diff-keys", type=int, default=2_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--cpu-share", type=float, default=1.0, help="the store's compaction_cpu_share")
    p.add_argument("--out", type=Path, help="directory for runs.jsonl")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.cpu_share)))
        return
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}: choose from {VARIANTS}")
    builds = {"A": args.a, "B": args.b}
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="snapcut-compaction-memory-") as scratch:
        # Each build merges a copy of the same prepared chain.
        prepared = {}
        for variant in variants:
            prepared[variant] = os.path.join(scratch, variant)
            prepare(prepared[variant], args.keys, args.diff_keys, variant)
        for r in range(args.rounds):
            order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
            for variant in variants:
                for build in order:
                    root = os.path.join(scratch, "run")
                    shutil.copytree(prepared[variant], root)
                    try:
                        res = run_child(builds[build], root, args.cpu_share)
                    finally:
                        shutil.rmtree(root, ignore_errors=True)
                    res.update(round=r, build=build, variant=variant)
                    runs.append(res)
                    print(json.dumps(res), flush=True)
    print("\nvariant  build  commit->merged s  busy s  rested s  anon peak MB  rss peak MB")
    for variant in variants:
        for build in builds:
            rs = [x for x in runs if x["variant"] == variant and x["build"] == build]
            med = {
                k: statistics.median(x[k] for x in rs) for k in rs[0] if k.endswith(("_s", "_mb"))
            }
            print(
                f"{variant:8} {build:5}  {med['commit_to_merged_s']:16.2f}  {med['busy_s']:6.2f}"
                f"  {med['rested_s']:8.2f}"
                f"  {med['anon_peak_mb']:12.0f}  {med['rss_peak_mb']:11.0f}"
            )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with (args.out / "runs.jsonl").open("w") as f:
            for x in runs:
                f.write(json.dumps(x) + "\n")


if __name__ == "__main__":
    main()
