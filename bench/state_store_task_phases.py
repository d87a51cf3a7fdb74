"""Where a level-2 Spark state task's memory goes, phase by phase, without
Spark (issue 37: "Python worker peak RSS within budget + 300 MB"): the task
code a Python worker runs for ``keyed_state(...).map_batches`` (a
``PartitionTask`` with a ``BatchFunctionProcessor``, its input held up to a
quarter of the budget and the rest applied in parts of whole keys, as
``snapcut.spark.state.task`` does) on a local root, under
``state_memory=BUDGET``, with the function of ``spark_big_state_tws.py l2``
(a pyarrow ``group_by`` of the rows and a ``join`` with their state).

Batch 0 of one partition creates KEYS keys from KEYS rows in 10k-row Arrow
batches (Spark's Arrow batch size; an affine permutation of the users made
a batch at a time), then two batches of 500k rows over random keys (a
1M-row batch's share of one of two partitions) go through the warm table.
A thread samples RssAnon (heap) and RssFile (mapped files' touched pages,
the libraries' included) every 10 ms with the phase the task is in; the
output is, per phase, the largest RssAnon seen (with the RssFile of that
sample) and the largest RssFile seen, and the seconds of each batch.

    python bench/state_store_task_phases.py 10000000 256MB

Run it with the project's venv python, nothing else running; a build is
selected by ``PYTHONPATH`` (a worktree's ``python`` directory).
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from children import status_bytes
from snapcut._core import state_memory_bytes
from snapcut.spark.processors import BatchFunctionProcessor
from snapcut.spark.roots import schema_bytes
from snapcut.spark.state.key_parts import hold, key_parts
from snapcut.spark.state.partition import PartitionTask
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import RootSpec
from snapcut.spark.state.warm import StateCache
from snapcut.spark.state.worker_memory import input_held_bytes
from spark_big_state_tws import l2_count_total

SCHEMA = pa.schema([("user", pa.int64()), ("dwell_ms", pa.int64())])
STATE = pa.schema([("user", pa.int64()), ("count", pa.int64()), ("total", pa.int64())])
LATER_ROWS = 500_000


class Phases:
    """The phase the task is in, and per phase the largest RssAnon and
    RssFile (MB) a sampling thread saw in it."""

    def __init__(self) -> None:
        self.now = "start"
        self.anon: dict[str, tuple[int, int]] = {}
        self.file: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            phase = self.now
            anon, file = status_bytes("RssAnon") >> 20, status_bytes("RssFile") >> 20
            if anon > self.anon.get(phase, (0, 0))[0]:
                self.anon[phase] = (anon, file)
            self.file[phase] = max(self.file.get(phase, 0), file)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


PHASES = Phases()


def count_total(rows: pa.Table, state: pa.Table, info: Any) -> Any:
    """``spark_big_state_tws.l2_count_total``, its phases marked."""
    batch = PHASES.now.split(":")[0]
    PHASES.now = f"{batch}:function"
    update = l2_count_total(rows, state, info)
    PHASES.now = f"{batch}:state update"
    return update


def first_batch(keys: int) -> Iterator[pa.RecordBatch]:
    # 1,000,003 is prime: coprime with any key count it does not divide.
    assert keys % 1_000_003 != 0
    for at in range(0, keys, 10_000):
        u = (np.arange(at, min(at + 10_000, keys), dtype=np.int64) * 1_000_003 + 7) % keys
        yield pa.record_batch([pa.array(u), pa.array(np.ones(len(u), np.int64))], schema=SCHEMA)


def main() -> None:
    keys, budget = int(sys.argv[1]), state_memory_bytes(sys.argv[2])
    root = str(Path(tempfile.mkdtemp(prefix="snapcut-phases-")) / "root")
    spec = RootSpec(
        uri=root,
        vertex="state",
        partitions=1,
        key=("user",),
        state_key="user",
        state_schema=schema_bytes(STATE),
        full_every=10,
        retain=10,
    )
    processor = BatchFunctionProcessor(
        key=("user",), state_key="user", state_schema=STATE, output_schema=STATE, fn=count_total
    )
    StateRoot(spec).init("map_batches")
    cache = StateCache()
    baseline = status_bytes("RssAnon") >> 20
    seconds = []

    t0 = time.monotonic()
    task = PartitionTask(StateRoot(spec), 0, 0, "bench", None, cache=cache, state_memory=budget)
    PHASES.now = "b0 input held"
    held, rest = hold(first_batch(keys), input_held_bytes(budget))
    assert rest is not None, "batch 0 must outgrow the input the task holds"
    PHASES.now = "b0 input split"
    parts = key_parts(held, rest, SCHEMA, ("user",), 0)
    del held

    def marked(parts: Iterator[pa.Table]) -> Iterator[pa.Table]:
        for part in parts:
            PHASES.now = "b0 parts"
            yield part

    rows_out = sum(out.num_rows for out in task.apply_parts(marked(parts), processor, None))
    assert rows_out == keys, rows_out
    PHASES.now = "b0 commit"
    task.commit()
    seconds.append(round(time.monotonic() - t0, 2))

    rng = np.random.default_rng(1)
    for b in (1, 2):
        rows = pa.table(
            {
                "user": rng.integers(0, keys, LATER_ROWS),
                "dwell_ms": rng.integers(0, 10_000, LATER_ROWS),
            }
        )
        t1 = time.monotonic()
        task = PartitionTask(StateRoot(spec), b, 0, "bench", None, cache=cache, state_memory=budget)
        PHASES.now = f"b{b} lookup"
        out = task.apply(rows, processor, None)
        PHASES.now = f"b{b} commit"
        task.commit()
        seconds.append(round(time.monotonic() - t1, 2))
        del out, rows
    PHASES.stop()
    print(
        json.dumps(
            {
                "keys": keys,
                "budget": sys.argv[2],
                "baseline_anon_mb": baseline,
                "seconds": seconds,
                "anon_peak_mb": {k: v[0] for k, v in PHASES.anon.items()},
                "file_at_anon_peak_mb": {k: v[1] for k, v in PHASES.anon.items()},
                "file_peak_mb": PHASES.file,
            }
        )
    )


if __name__ == "__main__":
    main()
