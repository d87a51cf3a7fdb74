"""Write and space amplification of the durable store over a long run (issue 37).

The experiments' three-shuffle job (`snapcut.experiments.flows.build`, 2 tasks
per operator) with aligned checkpoints every INTERVAL s into a durable root,
the compactor as configured by default (`compaction_cpu_share=1`,
`full_every=10`, `retained=1`). While it runs, a thread measures the root's
bytes on disk every 0.25 s. At the end, the live state: the final
checkpoint's state of every task, each written as one Arrow IPC file (what a
freshly compacted full would take).

- **write amplification** = (bytes of the checkpoints' own files + bytes the
  compactor wrote) / bytes of the checkpoints' own files: how many times each
  byte a checkpoint wrote is written again by compaction (RocksDB's
  definition, the checkpoints' files standing for the user's writes);
- **bytes written per live byte** = everything written / the live state;
- **space amplification** = the root's bytes on disk / the live state, at
  the end and at its largest during the run; beside it what the newest
  checkpoint's manifest names (the bytes a restore of it needs) / the live
  state, and how many checkpoint directories the root kept against how many
  the newest one names.

``--state-memory`` runs the job's keyed subtasks under a memory budget (their
state spilled to local runs, captures merged from them as the store writes).
Each case runs ROUNDS times; prints each run and writes ``--out`` (JSON: every
run with its per-checkpoint series).

    python bench/state_store_amplification.py --keys 1000000,10000000 \\
        --records 100000000 --rounds 2 --out bench/results/state_store/amplification/runs.json

Run it with the project's venv python, nothing else running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

import snapcut.snapshots
from children import spread
from snapcut import Checkpointing
from snapcut.experiments.flows import build


def root_bytes(root: str) -> int:
    """Bytes of the files under `root` now (files vanishing meanwhile skipped)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                continue
    return total


class SpaceSampler:
    """The root's bytes every `every_s` seconds until :meth:`stop`."""

    def __init__(self, root: str, every_s: float = 0.25) -> None:
        self.samples: list[tuple[float, int]] = []
        self._root = root
        self._every = every_s
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.samples.append((time.monotonic() - self._started, root_bytes(self._root)))

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def live_bytes(root: str) -> tuple[int, int]:
    """(bytes, rows) of the newest checkpoint's task states, each written as
    one Arrow IPC file."""
    states = snapcut.snapshots.open(root).latest().states()
    total, rows = 0, 0
    for table in states.values():
        sink = pa.MockOutputStream()
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        total += sink.size()
        rows += table.num_rows
    return total, rows


def referenced_bytes(root: str) -> tuple[int, int]:
    """(bytes, checkpoints) of the files the newest checkpoint's manifest
    names (its state runs, their filters, its own other files): what a
    restore of it reads, and the checkpoint directories they lie in."""
    newest = sorted(p for p in os.listdir(root) if p.startswith("chk-"))[-1]
    with open(os.path.join(root, newest, "manifest.json")) as f:
        manifest = json.load(f)
    named: dict[tuple[int, str], int] = {}
    for entry in manifest["files"]:
        own = {"checkpoint": manifest["checkpoint_id"], "path": entry["path"]}
        runs = entry.get("runs") or [own | {"bytes": entry["bytes"]}]
        for run in runs:
            named[(run["checkpoint"], run["path"])] = run["bytes"]
            if run.get("filter"):
                named[(run["checkpoint"], run["filter"]["path"])] = run["filter"]["bytes"]
    return sum(named.values()), len({c for c, _ in named})


def run_case(keys: int, records: int, interval: float, state_memory: str | None) -> dict[str, Any]:
    flow = build(records=records, keys=keys, parallelism=2)
    root = tempfile.mkdtemp(prefix="snapcut-amplification-")
    try:
        sampler = SpaceSampler(root)
        rep = flow.run(
            checkpointing=Checkpointing(
                protocol="aligned", interval=interval, state_memory=state_memory
            ),
            checkpoint_dir=root,
        )
        space = sampler.stop()
        end_bytes = root_bytes(root)
        needed, needed_dirs = referenced_bytes(root)
        dirs = sum(1 for p in os.listdir(root) if p.startswith("chk-"))
        live, live_rows = live_bytes(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    done = [c for c in rep.completed_checkpoints if c.store is not None]
    if not done:
        raise RuntimeError("a durable run's checkpoints carry no StoreMetrics")
    written = sum(c.store.bytes_written for c in done if c.store)
    last = done[-1].store
    assert last is not None
    compacted = last.compaction.bytes_written
    peak = max([b for _, b in space] + [end_bytes])
    return {
        "seconds": rep.duration_s,
        "checkpoints": len(done),
        "checkpoint_bytes": written,
        "compaction_bytes": compacted,
        "compactions_adopted": last.compaction.adopted,
        "compactions_discarded": last.compaction.discarded,
        "compactions_pending": last.compaction.pending,
        "live_bytes": live,
        "live_rows": live_rows,
        "root_bytes_end": end_bytes,
        "root_bytes_peak": peak,
        "newest_needs_bytes": needed,
        "newest_needs_checkpoints": needed_dirs,
        "checkpoint_dirs_end": dirs,
        "write_amplification": (written + compacted) / written,
        "written_per_live_byte": (written + compacted) / live,
        "space_amplification_end": end_bytes / live,
        "space_amplification_peak": peak / live,
        "space_amplification_needed": needed / live,
        "runs_max": max(c.store.runs_max for c in done if c.store),
        "series": [
            {
                "id": c.id,
                "finished_s": round(c.finished_s, 3),
                "bytes_written": c.store.bytes_written,
                "runs_max": c.store.runs_max,
                "debt_bytes": c.store.debt_bytes,
                "compaction_bytes_written": c.store.compaction.bytes_written,
            }
            for c in done
            if c.store
        ],
        "space": [(round(t, 2), b) for t, b in space],
    }


def dirs_named(run: dict[str, Any]) -> str:
    return f"{run['checkpoint_dirs_end']} / {run['newest_needs_checkpoints']}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", default="1000000,10000000", help="comma-separated key counts")
    p.add_argument("--records", type=int, default=100_000_000)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--state-memory",
        default=None,
        help="each keyed subtask's memory budget (Checkpointing(state_memory=), e.g. 8MB); "
        "default: all in memory",
    )
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    cases = [int(k) for k in a.keys.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {k: [] for k in cases}
    for r in range(a.rounds):
        for keys in cases if r % 2 == 0 else cases[::-1]:
            load = os.getloadavg()[0]
            got = run_case(keys, a.records, a.interval, a.state_memory)
            got |= {"round": r, "load_1m": round(load, 2)}
            runs[keys].append(got)
            print(
                json.dumps({k: v for k, v in got.items() if k not in ("series", "space")}),
                flush=True,
            )
    print()
    print(
        "| keys | live state, MB | checkpoints | write amplification | written per live byte "
        "| space amplification, end | space amplification, peak | the newest needs "
        "| checkpoint dirs kept / named by the newest | most runs a task |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for keys in cases:
        rs = runs[keys]

        def col(k: str, rs: list[dict[str, Any]] = rs) -> str:
            return spread([float(r[k]) for r in rs], ".2f")

        print(
            f"| {keys:,} | {statistics.median(r['live_bytes'] for r in rs) / 2**20:.0f} "
            f"| {', '.join(str(r['checkpoints']) for r in rs)} | {col('write_amplification')} "
            f"| {col('written_per_live_byte')} | {col('space_amplification_end')} "
            f"| {col('space_amplification_peak')} | {col('space_amplification_needed')} "
            f"| {', '.join(dirs_named(r) for r in rs)} "
            f"| {', '.join(str(r['runs_max']) for r in rs)} |"
        )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"args": vars(a) | {"out": str(a.out)}, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
