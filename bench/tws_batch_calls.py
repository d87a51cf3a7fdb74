"""The transformWithState batch code alone, without Spark: one batch of N new
keys (one row each) through ``TransformWithStateProcessor.process`` on
in-memory tables, with ``bench/spark_big_state_tws.py``'s processors. Prints
the time and µs a key. The first argument, a build's ``python/``, comes first on the path
(an A/B of two builds, interleaved by the caller).

    python bench/tws_batch_calls.py /path/to/build/python 100000 pandas|rows
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, sys.argv[1])

import numpy as np
import pyarrow as pa

from snapcut.spark.testing import TwsTester
from spark_big_state_tws import OUTPUT, PandasCountTotal, RowCountTotal


def main() -> None:
    n, mode = int(sys.argv[2]), sys.argv[3]
    proc = PandasCountTotal() if mode == "pandas" else RowCountTotal()
    tester = TwsTester(proc, "user long", outputStructType=OUTPUT)
    step = tester._processor(mode == "pandas")
    rng = np.random.default_rng(1)
    rows = pa.table(
        {"user": rng.permutation(n).astype(np.int64), "dwell_ms": rng.integers(0, 1000, n)}
    )
    t0 = time.perf_counter()
    out = step.process(tester.tables, rows, tester._info())
    dt = time.perf_counter() - t0
    assert out.num_rows == n, out.num_rows
    print(f"{mode} {n} {dt:.2f}s {dt / n * 1e6:.1f} us/key")


if __name__ == "__main__":
    main()
