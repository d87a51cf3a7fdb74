"""``../shared/tools/spark-big-state`` with a transformWithState processor (or
level 3, ``applyInPandasWithState``, or level 2, ``map_batches``) in place of
level 1: the same input
(batch 0 creates KEYS keys, then BATCHES batches of 1M rows over random keys
of them; one parquet file per micro-batch), the same session (local[2], 2
shuffle and 2 state partitions, 8 GB driver, noop sink), and a
``StatefulProcessor`` keeping what level 1 keeps (a ValueState of count and
total per user, one output row per user a batch; level 3: the same as an
``applyInPandasWithState`` function with a ``GroupState``; level 2: a
pyarrow function of a partition's rows and their keys' state). Prints the
tool's JSON line: addBatch ms per batch and the peak RSS (VmHWM, MB) of the
Python workers and of the JVM, and the largest RssAnon (heap) and RssFile
(touched pages of mapped files) sampled in one Python worker.

    python bench/spark_big_state_tws.py 20000000 rows 256MB   # transformWithState (Rows)
    python bench/spark_big_state_tws.py 20000000 ttl 256MB    # ... its ValueState with a TTL
    python bench/spark_big_state_tws.py 20000000 pandas        # ...InPandas, no budget
    python bench/spark_big_state_tws.py 2000000 l3 32MB         # level 3 (applyInPandasWithState)
    python bench/spark_big_state_tws.py 10000000 l2 256MB      # level 2 (map_batches, Arrow)

Run it with the project's venv python, nothing else running.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.streaming.stateful_processor import TimerValues

from children import ProcessPeaks
from state_store_cold import session

STATE = "count long, total long"
OUTPUT = "user long, count long, total long"


class CountTotal(StatefulProcessor):
    """Level 1's count and sum per user, as a transformWithState processor."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("agg", STATE)

    def _add(self, n: int, total: int) -> tuple[int, int]:
        if self.state.exists():
            c, t = self.state.get()
            n, total = n + c, total + t
        self.state.update((n, total))
        return n, total

    def close(self) -> None:
        pass


class RowCountTotal(CountTotal):
    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Any:
        n = total = 0
        for r in rows:
            n += 1
            total += r.dwell_ms
        n, total = self._add(n, total)
        yield Row(user=key[0], count=n, total=total)


class TtlCountTotal(RowCountTotal):
    """The same, its ValueState expiring an hour after its last update
    (processing time): every key has a time in the state's time index, and
    a full stores the index beside it (format 5). Nothing expires in the
    run (its batches take minutes)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.state = handle.getValueState("agg", STATE, 3_600_000)


class PandasCountTotal(CountTotal):
    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        import pandas as pd

        n = total = 0
        for pdf in rows:
            n += len(pdf)
            total += int(pdf["dwell_ms"].sum())
        n, total = self._add(n, total)
        yield pd.DataFrame({"user": [key[0]], "count": [n], "total": [total]})


def l3_count_total(key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    """Level 1's count and sum per user, as an ``applyInPandasWithState`` function."""
    import pandas as pd

    n, total = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        n += len(pdf)
        total += int(pdf["dwell_ms"].sum())
    state.update((n, total))
    yield pd.DataFrame({"user": [key[0]], "count": [n], "total": [total]})


def l2_count_total(rows: pa.Table, state: pa.Table, info: Any) -> Any:
    """Level 1's count and sum per user, as a ``map_batches`` function (as
    ``spark_state.dwell_batch``; defined here, in ``__main__``, so that Spark's
    workers get it by value: they cannot import the bench's modules)."""
    import pyarrow.compute as pc

    from snapcut.spark import StateUpdate

    agg = rows.group_by("user").aggregate([("dwell_ms", "count"), ("dwell_ms", "sum")])
    joined = agg.join(state.select(["user", "count", "total"]), "user")
    count = pc.add(pc.fill_null(joined["count"], 0), joined["dwell_ms_count"])
    total = pc.add(pc.fill_null(joined["total"], 0), joined["dwell_ms_sum"])
    new = pa.table({"user": joined["user"], "count": count, "total": total})
    return StateUpdate(output=new, state=new)


def hwm(pattern: str) -> int:
    """The largest VmHWM (MB) of the processes whose command line has `pattern`."""
    best = 0
    for st in glob.glob("/proc/[0-9]*/status"):
        try:
            status = Path(st)
            if pattern in status.with_name("cmdline").read_text():
                lines = status.read_text().splitlines()
                best = max(best, *(int(x.split()[1]) for x in lines if x.startswith("VmHWM")))
        except (OSError, ValueError):
            pass
    return best // 1024


def main() -> None:
    keys = int(sys.argv[1])
    api = sys.argv[2]
    if api not in ("rows", "ttl", "pandas", "l3", "l2"):
        raise SystemExit("usage: spark_big_state_tws.py KEYS rows|ttl|pandas|l3|l2 [BUDGET]")
    budget = sys.argv[3] if len(sys.argv) > 3 else None
    batches = int(os.environ.get("BATCHES", "4"))
    d = tempfile.mkdtemp()
    rng = np.random.default_rng(1)
    os.makedirs(f"{d}/in")
    t0 = int(time.time()) - 3600
    users = np.arange(keys, dtype=np.int64)
    tables = [pa.table({"user": users, "dwell_ms": rng.integers(0, 10000, keys)})]
    tables += [
        pa.table(
            {
                "user": rng.integers(0, keys, 1_000_000),
                "dwell_ms": rng.integers(0, 10000, 1_000_000),
            }
        )
        for _ in range(batches)
    ]
    for i, t in enumerate(tables):
        path = f"{d}/in/part-{i:05d}.parquet"
        pq.write_table(t, path)
        os.utime(path, (t0 + 10 * i, t0 + 10 * i))
    spark = session()  # the tool's: local[2], 2 shuffle partitions, 8 GB driver
    ev = (
        spark.readStream.schema("user long, dwell_ms long")
        .option("maxFilesPerTrigger", 1)
        .parquet(f"{d}/in")
    )
    from snapcut.spark import keyed_state

    kw = {"state_memory": budget} if budget else {}
    keyed = keyed_state(ev, key="user", root=f"{d}/state", partitions=2, **kw)
    if api == "rows":
        out = keyed.transformWithState(RowCountTotal(), OUTPUT, "Update", "None")
    elif api == "ttl":
        out = keyed.transformWithState(TtlCountTotal(), OUTPUT, "Update", "ProcessingTime")
    elif api == "l3":
        out = keyed.applyInPandasWithState(l3_count_total, OUTPUT, STATE, "Update", "NoTimeout")
    elif api == "l2":
        out = keyed.map_batches(l2_count_total, STATE, OUTPUT)
    else:
        out = keyed.transformWithStateInPandas(PandasCountTotal(), OUTPUT, "Update", "None")
    workers = ProcessPeaks("pyspark.daemon")
    writer = (
        out.writeStream.format("noop").outputMode("update").option("checkpointLocation", f"{d}/chk")
    )
    if api == "ttl":
        # Processing-time TTL runs a no-data batch at every trigger (Spark's
        # rule for processing-time state), so neither availableNow nor
        # processAllAvailable ends: a trigger every 10 s (few no-data
        # batches among the progresses kept), stopped once every file is in.
        q = writer.trigger(processingTime="10 seconds").start()
        while sum(p["numInputRows"] > 0 for p in q.recentProgress) < len(tables):
            if q.exception() is not None:
                raise SystemExit(f"the query failed: {q.exception()}")
            time.sleep(1)
        q.stop()
    else:
        q = writer.trigger(availableNow=True).start()
        q.awaitTermination()
    data = [p for p in q.recentProgress if p["numInputRows"] > 0]
    print(
        json.dumps(
            {
                "keys": keys,
                "variant": api if api in ("l2", "l3") else f"tws-{api}",
                "budget": budget,
                "addBatch_ms": [p["durationMs"].get("addBatch") for p in data],
                "py_worker_hwm_mb": hwm("pyspark.daemon"),
                **{f"py_worker_{k}": v for k, v in workers.stop().items()},
                "jvm_hwm_mb": hwm("java"),
            }
        )
    )
    spark.stop()


if __name__ == "__main__":
    main()
