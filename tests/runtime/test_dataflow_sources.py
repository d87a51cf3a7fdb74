"""Sources from Python (iterables, generators, pyarrow datasets), sinks, parallelism."""

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from snapcut import Checkpointing, Dataflow


def test_from_iterable_of_dicts_tuples_and_batches() -> None:
    flow = Dataflow()
    flow.from_iterable([{"a": i, "b": str(i)} for i in range(10)], batch_size=3).collect("dicts")
    schema = pa.schema([("a", pa.int32()), ("b", pa.string())])
    flow.from_iterable([(i, str(i)) for i in range(5)], schema=schema).collect("tuples")
    batches = [pa.record_batch({"a": [1, 2]}), pa.record_batch({"a": [3]})]
    flow.from_iterable(batches).collect("batches")
    report = flow.run()
    assert sorted(report.results["dicts"]["a"].to_pylist()) == list(range(10))
    tuples = report.results["tuples"]
    assert tuples.schema == schema
    assert sorted(tuples["b"].to_pylist()) == [str(i) for i in range(5)]
    assert sorted(report.results["batches"]["a"].to_pylist()) == [1, 2, 3]


def test_one_shot_iterator_and_generator_function() -> None:
    flow = Dataflow()
    flow.from_iterable(iter([{"x": i} for i in range(7)])).collect("iter")

    def gen():  # type: ignore[no-untyped-def]
        for i in range(4):
            yield {"x": i * 10}

    flow.from_iterable(gen, batch_size=2).collect("gen")
    report = flow.run()
    assert sorted(report.results["iter"]["x"].to_pylist()) == list(range(7))
    assert sorted(report.results["gen"]["x"].to_pylist()) == [0, 10, 20, 30]


@pytest.mark.parametrize("parallelism", [1, 3])
def test_python_source_offsets_are_recorded(parallelism: int) -> None:
    n = 3_000
    flow = Dataflow(parallelism=2)
    src = flow.from_iterable(
        [{"k": i % 5, "v": i} for i in range(n)],
        batch_size=100,
        parallelism=parallelism,
        name="rows",
    )
    src.key_by("k").aggregate(total=("sum", "v")).collect("sums")
    report = flow.run(Checkpointing(protocol="aligned", interval=0.001))
    assert sum(report.results["sums"]["total"].to_pylist()) == sum(range(n))
    final = report.snapshots[-1]
    assert sum(final.source_offsets.values()) == n
    assert set(final.source_offsets) == {f"rows-{i}" for i in range(parallelism)}


def test_from_dataset_parquet_directory(tmp_path: Path) -> None:
    for part in range(3):
        table = pa.table({"user": [part] * 100, "ms": list(range(part * 100, part * 100 + 100))})
        pq.write_table(table, tmp_path / f"part-{part}.parquet")
    flow = Dataflow(parallelism=2)
    src = flow.from_dataset(str(tmp_path), columns=["user", "ms"], batch_size=40)
    src.key_by("user").aggregate(n="count", top=("max", "ms")).collect("r")
    report = flow.run(Checkpointing(protocol="chandy-lamport", interval=0.001))
    got = report.results["r"].sort_by("user").to_pydict()
    assert got == {"user": [0, 1, 2], "n": [100, 100, 100], "top": [99, 199, 299]}


def test_from_dataset_object_with_filter_and_table() -> None:
    table = pa.table({"x": list(range(100))})
    flow = Dataflow()
    flow.from_dataset(ds.dataset(table), filter=pc.field("x") >= 90).collect("filtered")
    flow.from_dataset(table).collect("table")
    report = flow.run()
    assert sorted(report.results["filtered"]["x"].to_pylist()) == list(range(90, 100))
    assert len(report.results["table"]) == 100


def test_write_arrow_files(tmp_path: Path) -> None:
    flow = Dataflow(parallelism=2)
    events = flow.generate_dwell_events(users=20, count=5_000, seed=1)
    events.key_by("user").aggregate(n="count").write_arrow(str(tmp_path / "out"))
    flow.run(Checkpointing(protocol="aligned", interval=0.01))
    files = sorted((tmp_path / "out").glob("part-*.arrow"))
    assert files
    tables = [ipc.open_file(f).read_all() for f in files]
    merged = pa.concat_tables(tables)
    assert sorted(merged["user"].to_pylist()) == list(range(20))
    assert sum(merged["n"].to_pylist()) == 5_000


def test_per_operator_parallelism() -> None:
    flow = Dataflow(parallelism=3)
    src = flow.from_batches(pa.table({"x": list(range(1000))}).to_batches(max_chunksize=10))
    one = src.map(lambda b: b, parallelism=1, name="narrow")
    wide = one.filter(lambda b: pc.less(b["x"], 500), parallelism=4, name="wide")
    wide.collect("r", parallelism=2)
    report = flow.run(Checkpointing(protocol="aligned", interval=0.005))
    assert sorted(report.results["r"]["x"].to_pylist()) == list(range(500))
    tasks = set(report.snapshots[-1].tasks)
    assert {"narrow-0", "wide-3", "collect-r-1"} <= tasks
    assert "narrow-1" not in tasks
