"""The smoke of ``bench/lakehouse.py`` (the sink's Delta and Iceberg outputs
against the Arrow IPC output and a hand-written ``write_deltalake``
``foreachBatch``): under ``--benchmark-disable`` each output runs the update
query once over two tiny batches, and the four hold the same rows; the
figures come from ``python bench/lakehouse.py`` (bench/results/lakehouse/).
No timings here: without the ``benchmark`` fixture ``--benchmark-only``
skips it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")


def test_every_output_once_and_the_same_rows(spark: Any, smoke: bool, tmp_path: Path) -> None:
    if not smoke:
        pytest.skip("a smoke test: bench/lakehouse.py takes the figures")
    from pyiceberg.catalog import load_catalog

    from lakehouse import OUTPUTS, catalog, run
    from snapcut.spark import DeltaOutput, read_output_arrow
    from spark_state import write_input

    write_input(tmp_path / "in", 50, 400, 2)
    got = {}
    for output in OUTPUTS:
        res = run(spark, output, "update", tmp_path / "in", tmp_path)
        assert len(res["trigger_s"]) == 2, output
        where = res["where"]
        if output == "arrow":
            table = read_output_arrow(where)
        elif output == "iceberg":
            table = load_catalog("snapcut", **catalog(tmp_path)).load_table(where).scan().to_arrow()
        else:
            table = DeltaOutput(where).read()
        columns = (table[c].to_pylist() for c in ("user", "n", "total"))
        got[output] = sorted(zip(*columns, strict=True))
    assert len({tuple(rows) for rows in got.values()}) == 1, got
    assert sum(n for _, n, _ in got["arrow"]) == 800
