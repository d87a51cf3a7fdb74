"""``ArrowSnapshotSink``: round trips in append, update and complete mode
against pandas; exactly once under re-delivered batches, task retries,
driver failures before and after the commit, and a restart from the same
checkpointLocation; the global snapshot of state + output + Spark's offsets;
what plain readers (pyarrow.dataset, DuckDB) see; and bad input (schema
changes, unwritable roots, a root of another query, a full disk), which
fails with a clear error and touches nothing committed."""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as ds
import pytest
from pyspark.sql import functions as F
from table_sink import (  # points, dwell, armed: fixtures, pytest finds them here
    FILES,
    armed,
    as_totals,
    dwell,
    event_rows,
    fail_driver_at,
    manifest,
    points,
    run,
    totals,
)
from tests.spark_support import (
    child_env,
    dwell_frames,
    is_connect,
    object_store,
    start_session,
    stream,
    write_inputs,
)

from snapcut import ConfigError, SnapshotError, StorageError, snapshots
from snapcut.spark import (
    ArrowSnapshotSink,
    keyed_state,
    read_output,
    read_output_arrow,
    read_state_arrow,
)
from snapcut.spark import failpoints as fp
from snapcut.spark.sink import commit as sink_module
from snapcut.spark.state import root as state_root_module
from snapcut.spark.state.root import StateRoot, spec_of

__all__ = ["armed", "dwell", "points"]  # fixtures, imported for pytest

SESSION_KINDS = True  # tests/conftest.py: both_sessions tests also run on Connect


@pytest.fixture(scope="module")
def spark(points: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    session = start_session(
        "local[2,4]",
        kind=request.param,
        **{"spark.executorEnv.SNAPCUT_SPARK_FAILPOINTS": f"@{points}"},
    )
    yield session
    session.stop()


def committed_files(root: Path) -> dict[str, bytes]:
    """Every file of every committed batch directory, by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.glob("chk-*/*"))
        if (p.parent / "manifest.json").exists()
    }


# --- round trips ------------------------------------------------------------


@pytest.mark.both_sessions
def test_append_round_trip_and_every_reader_sees_the_committed_rows(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, events = dwell
    root = tmp_path / "out"
    sink = ArrowSnapshotSink(str(root))
    run(stream(spark, directory), sink, tmp_path / "chk")
    history = sink.history()
    assert [h.batch_id for h in history] == list(range(FILES))
    if not is_connect(spark):  # reports fill where foreachBatch runs: here on classic
        assert [r.batch_id for r in sink.reports if r.committed] == list(range(FILES))
        assert [(r.rows, r.files) for r in sink.reports] == [(h.rows, h.files) for h in history]
    want = event_rows(events)
    assert event_rows(read_output_arrow(str(root))) == want
    assert event_rows(read_output(spark, str(root)).toArrow()) == want
    # A batch's manifest names its files and Spark's offsets for that batch.
    for b in range(FILES):
        m = manifest(root, b)
        outputs = [f for f in m["files"] if f["role"] == "output"]
        assert sum(f["rows"] for f in outputs) == m["output"]["rows"] > 0
        assert m["spark"]["offsets"]["sources"] == [{"logOffset": b}]
        offsets = (tmp_path / "chk" / "offsets" / str(b)).read_text().splitlines()
        assert json.loads(offsets[2]) == {"logOffset": b}
        assert m["spark"]["query_id"] == m["graph_fingerprint"].removeprefix("spark-sink:")
    # As of a batch: the rows of the files up to it.
    first = dwell_frames(files=FILES, rows=600, users=40, seed=5)[0]
    assert event_rows(read_output_arrow(str(root), batch=0)) == event_rows(first)
    # Plain readers: the committed files are chk-*/part-*.arrow.
    files = sorted(glob.glob(f"{root}/chk-*/part-*.arrow"))
    assert len(files) == sum(h.files for h in history)
    table = ds.dataset(files, format="ipc").to_table()
    assert event_rows(table) == want
    duckdb = pytest.importorskip("duckdb")
    dataset = ds.dataset(files, format="ipc")  # noqa: F841 (DuckDB reads it by name)
    ((n, total),) = duckdb.sql("select count(*), sum(dwell_ms) from dataset").fetchall()
    assert (n, total) == (len(events), int(events["dwell_ms"].sum()))
    pl = pytest.importorskip("polars")
    frame = pl.scan_ipc(f"{root}/chk-*/part-*.arrow").collect()
    assert frame.height == len(events)


def test_rust_and_python_readers_list_and_verify_sink_checkpoints(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, _ = dwell
    root = tmp_path / "out"
    run(stream(spark, directory), ArrowSnapshotSink(str(root)), tmp_path / "chk")
    for name in (str(root), root.as_uri()):  # the Rust reader, then the pyarrow.fs one
        snaps = snapshots.open(name)
        assert snaps.list() == list(range(FILES))
        assert snaps.verify() == {b: None for b in range(FILES)}
        latest = snaps.latest()
        assert latest.protocol == "spark-microbatch"
        roles = Counter(f["role"] for f in latest.files)
        assert roles["output"] >= 1 and roles["sources"] == 1
        assert latest.manifest["output"]["mode"] == "append"
        assert all("partition" in f for f in latest.files if f["role"] == "output")
    # A corrupt output file is detected by both readers.
    victim = sorted(root.glob("chk-00000001/part-*.arrow"))[0]
    data = bytearray(victim.read_bytes())
    data[-20] ^= 0xFF
    victim.write_bytes(bytes(data))
    for name in (str(root), root.as_uri()):
        broken = snapshots.open(name).verify()
        assert broken[1] is not None and broken[0] is None and broken[2] is None
    with pytest.raises(SnapshotError, match="checksum"):
        read_output_arrow(str(root))


@pytest.mark.both_sessions
def test_update_mode_keeps_the_newest_row_per_key(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, events = dwell
    root = tmp_path / "out"
    agg = (
        stream(spark, directory)
        .groupBy("user")
        .agg(F.count("*").alias("n"), F.sum("dwell_ms").alias("total"))
    )
    sink = ArrowSnapshotSink(str(root), output_mode="update", key="user")
    run(agg, sink, tmp_path / "chk", "update")
    assert as_totals(read_output_arrow(str(root))) == totals(events)
    assert as_totals(read_output(spark, str(root)).toArrow()) == totals(events)
    # Each batch's files hold only the keys it changed; as of batch 0 the table
    # is the first file's aggregate.
    first = dwell_frames(files=FILES, rows=600, users=40, seed=5)[0]
    assert as_totals(read_output_arrow(str(root), batch=0)) == totals(first)
    assert as_totals(read_output(spark, str(root), batch=0).toArrow()) == totals(first)
    assert all(manifest(root, b)["output"]["rows"] <= 40 for b in range(FILES))


@pytest.mark.both_sessions
def test_update_mode_into_a_delta_table_takes_the_rows_on_the_driver(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    """A table output in update mode takes each batch with ``toArrow()`` where
    foreachBatch runs: this process (classic) or the Connect server's Python
    worker. The table holds the newest row per key, one commit per batch."""
    deltalake = pytest.importorskip("deltalake")
    from snapcut.spark import DeltaOutput

    directory, events = dwell
    root, table = tmp_path / "out", tmp_path / "table"
    agg = (
        stream(spark, directory)
        .groupBy("user")
        .agg(F.count("*").alias("n"), F.sum("dwell_ms").alias("total"))
    )
    sink = ArrowSnapshotSink(
        str(root),
        output_mode="update",
        key="user",
        output=DeltaOutput(str(table)),
    )
    run(agg, sink, tmp_path / "chk", "update")
    dt = deltalake.DeltaTable(str(table))
    assert as_totals(DeltaOutput(str(table)).read()) == totals(events)
    history = list(reversed(dt.history()))
    assert [h.get("snapcut.batch") for h in history] == list(range(FILES))
    for b in range(FILES):
        record = manifest(root, b)["output"]
        assert record["delta"]["version"] == b and record["files"] == 0
        assert 0 < record["rows"] <= 40


@pytest.mark.both_sessions
def test_complete_mode_reads_the_newest_batch(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, events = dwell
    root = tmp_path / "out"
    agg = (
        stream(spark, directory)
        .groupBy("user")
        .agg(F.count("*").alias("n"), F.sum("dwell_ms").alias("total"))
    )
    run(agg, ArrowSnapshotSink(str(root), output_mode="complete"), tmp_path / "chk", "complete")
    assert as_totals(read_output_arrow(str(root))) == totals(events)
    assert as_totals(read_output(spark, str(root)).toArrow()) == totals(events)
    first_two = pd.concat(dwell_frames(files=FILES, rows=600, users=40, seed=5)[:2])
    assert as_totals(read_output_arrow(str(root), batch=1)) == totals(first_two)


# --- exactly once -------------------------------------------------------------


def test_a_redelivered_batch_is_a_no_op(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, events = dwell
    root = tmp_path / "out"
    sink = ArrowSnapshotSink(str(root))

    def twice(df: Any, batch_id: int) -> None:
        sink(df, batch_id)
        before = committed_files(root)
        sink(df, batch_id)  # Spark re-delivering the batch after a restart
        assert committed_files(root) == before

    run(stream(spark, directory), twice, tmp_path / "chk")
    assert [(r.batch_id, r.committed) for r in sink.reports] == [
        (b, c) for b in range(FILES) for c in (True, False)
    ]
    assert event_rows(read_output_arrow(str(root))) == event_rows(events)
    # The same with a plain DataFrame called by hand.
    plain = ArrowSnapshotSink(str(tmp_path / "plain"))
    df = spark.createDataFrame(pd.DataFrame({"user": [1, 2], "n": [3, 4]}))
    assert plain(df, 7) is None and plain.write_batch(df, 7).committed is False
    assert read_output_arrow(str(tmp_path / "plain")).num_rows == 2


def test_task_retries_commit_only_the_winning_attempts(
    spark: Any,
    dwell: tuple[Path, pd.DataFrame],
    armed: Callable[[str], None],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    directory, events = dwell
    root = tmp_path / "out"
    # Batch 1: partition 0's first attempt stages its file then raises;
    # partition 2's first attempt is SIGKILLed after staging.
    armed("sink.after_stage:1:0:raise:0,sink.after_stage:1:2:kill:0")
    staged: dict[int, list[str]] = {}
    real = fp.hit

    def spy(name: str, b: int, partition: int) -> None:
        if name == "sink.before_commit":
            staged[b] = sorted(os.listdir(root / "_staging" / f"{b:08d}"))
        real(name, b, partition)

    monkeypatch.setattr(fp, "hit", spy)
    sink = ArrowSnapshotSink(str(root))
    run(stream(spark, directory).repartition(3), sink, tmp_path / "chk")
    attempts = {f["partition"]: f["attempt"] for f in manifest(root, 1)["files"] if "attempt" in f}
    assert attempts[0] >= 1 and attempts[2] >= 1 and attempts[1] == 0
    losers = [n for n in staged[1] if n.startswith(("part-00000-0-a0-", "part-00002-0-a0-"))]
    assert len(losers) == 2  # the failed attempts did stage files ...
    names = {f["path"] for f in manifest(root, 1)["files"]}
    assert names == {p.name for p in (root / "chk-00000001").iterdir()} - {"manifest.json"}
    assert not (root / "_staging").exists()  # ... which were never committed
    assert event_rows(read_output_arrow(str(root))) == event_rows(events)


def test_driver_failures_around_the_commit_and_a_restart_are_exactly_once(
    spark: Any, dwell: tuple[Path, pd.DataFrame], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    directory, events = dwell
    root = tmp_path / "out"
    chk = tmp_path / "chk"
    # 1. The driver fails after staging batch 1, before its manifest.
    fail_driver_at(monkeypatch, "sink.before_commit", 1)
    with pytest.raises(Exception, match=r"injected driver failure at sink.before_commit"):
        run(stream(spark, directory), ArrowSnapshotSink(str(root)), chk)
    assert snapshots.open(str(root)).list() == [0]
    assert any((root / "_staging").rglob("*.arrow"))  # staged, not committed ...
    files = sorted(glob.glob(f"{root}/chk-*/part-*.arrow"))
    first = dwell_frames(files=FILES, rows=600, users=40, seed=5)[0]
    assert event_rows(ds.dataset(files, format="ipc").to_table()) == event_rows(first)
    assert event_rows(read_output_arrow(str(root))) == event_rows(first)
    # 2. Restarted (same checkpointLocation): batch 1 re-runs, then the driver
    # fails after committing batch 2, before Spark records it.
    monkeypatch.undo()
    fail_driver_at(monkeypatch, "sink.after_commit", 2)
    sink = ArrowSnapshotSink(str(root))
    with pytest.raises(Exception, match=r"injected driver failure at sink.after_commit"):
        run(stream(spark, directory), sink, chk)
    assert [r.batch_id for r in sink.reports] == [1, 2]
    assert not (chk / "commits" / "2").exists()
    # 3. Restarted again: Spark re-delivers batch 2, which the sink skips.
    monkeypatch.undo()
    again = ArrowSnapshotSink(str(root))
    run(stream(spark, directory), again, chk)
    assert [(r.batch_id, r.committed) for r in again.reports] == [(2, False)]
    assert event_rows(read_output_arrow(str(root))) == event_rows(events)
    assert snapshots.open(str(root)).list() == list(range(FILES))
    assert not (root / "_staging").exists()


def test_without_directory_renames_the_manifest_is_written_last(
    spark: Any, dwell: tuple[Path, pd.DataFrame], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a filesystem that cannot rename directories (an object store), the
    files of batch N move into chk-N first and the manifest comes last; a
    crash in between leaves a partial chk-N that readers skip and the next
    start removes."""
    directory, events = dwell
    store, root, chk = object_store(), str(tmp_path / "out"), tmp_path / "chk"
    real_commit = sink_module.SnapshotWriter.commit

    def crash(self: Any, checkpoint_id: int, *args: Any, **kwargs: Any) -> Any:
        if checkpoint_id == 1:
            raise fp.InjectedFailure("injected failure before batch 1's manifest")
        return real_commit(self, checkpoint_id, *args, **kwargs)

    monkeypatch.setattr(sink_module.SnapshotWriter, "commit", crash)
    with pytest.raises(Exception, match="before batch 1's manifest"):
        run(stream(spark, directory), ArrowSnapshotSink(root, filesystem=store), chk)
    snaps = snapshots.open(root, filesystem=store)
    assert (snaps.list(), snaps.partial()) == ([0], [1])
    assert list((tmp_path / "out" / "chk-00000001").glob("part-*.arrow"))
    first = dwell_frames(files=FILES, rows=600, users=40, seed=5)[0]
    assert event_rows(read_output_arrow(root, filesystem=store)) == event_rows(first)
    monkeypatch.undo()
    run(stream(spark, directory), ArrowSnapshotSink(root, filesystem=store), chk)
    snaps = snapshots.open(root, filesystem=store)
    assert (snaps.list(), snaps.partial()) == (list(range(FILES)), [])
    assert snaps.verify() == {b: None for b in range(FILES)}
    assert event_rows(read_output_arrow(root, filesystem=store)) == event_rows(events)
    assert event_rows(read_output(spark, root, filesystem=store).toArrow()) == event_rows(events)
    assert not (tmp_path / "out" / "_staging").exists()


# --- one global snapshot: state + output + offsets ----------------------------


def dwell_averages(spark: Any, directory: Path, state_root: Path) -> Any:
    ks = keyed_state(stream(spark, directory), "user", str(state_root), 3, full_every=2)
    return ks, ks.aggregate(count="count", total=("sum", "dwell_ms"))


@pytest.mark.both_sessions
def test_state_output_and_offsets_commit_as_one_snapshot(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, events = dwell
    root, state_root, chk = tmp_path / "out", tmp_path / "state", tmp_path / "chk"
    ks, averages = dwell_averages(spark, directory, state_root)
    sink = ArrowSnapshotSink(str(root), output_mode="update", key="user", state=ks)
    run(averages, sink, chk, "update")
    assert as_totals(read_output_arrow(str(root)), "count") == totals(events)
    state = read_state_arrow(str(state_root)).to_pylist()
    assert {r["user"]: r["count"] for r in state} == {u: n for u, (n, _) in totals(events).items()}
    for b in range(FILES):
        m = manifest(root, b)
        state_manifest = json.loads((state_root / m["state"]["manifest"]).read_text())
        assert state_manifest["checkpoint_id"] == m["state"]["batch"] == b
        want = {
            f"{snapshots.checkpoint_dir_name(b)}/{f['path']}": (f["bytes"], f["crc32c"])
            for f in state_manifest["files"]
            if f["role"] == "state"
        }
        named = {f["path"]: (f["bytes"], f["crc32c"]) for f in m["state"]["files"]}
        assert named == want and len(named) == 3
        for path, (size, _) in named.items():
            assert (state_root / path).stat().st_size == size
        assert m["spark"]["offsets"]["sources"] == [{"logOffset": b}]
        assert m["spark"]["query_id"] == state_manifest["spark"]["query_id"]


def test_the_query_builds_its_state_root_once_and_the_sink_takes_that_object(
    spark: Any,
    dwell: tuple[Path, pd.DataFrame],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The walk from keyed_state(root=...) to the state files passes one
    StateRoot: built once by the facade (the filesystem resolved once),
    pickled into the tasks, and handed to the sink, which never rebuilds it
    from the path or reads the root's description again."""
    directory, events = dwell
    root, state_root, chk = tmp_path / "out", tmp_path / "state", tmp_path / "chk"
    built: list[str] = []
    meta_reads: list[str] = []
    real_init, real_meta = StateRoot.__init__, state_root_module._read_meta

    def counting_init(self: StateRoot, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        built.append(self.name)

    def counting_meta(directory: Any) -> dict[str, Any]:
        meta_reads.append(directory.name)
        return real_meta(directory)

    monkeypatch.setattr(StateRoot, "__init__", counting_init)
    monkeypatch.setattr(state_root_module, "_read_meta", counting_meta)
    ks, averages = dwell_averages(spark, directory, state_root)
    sink = ArrowSnapshotSink(str(root), output_mode="update", key="user", state=ks)
    run(averages, sink, chk, "update")
    assert built == [str(state_root)]
    assert meta_reads == []
    assert sink._state_root() is ks.state_root
    assert as_totals(read_output_arrow(str(root)), "count") == totals(events)
    assert [manifest(root, b)["state"]["batch"] for b in range(FILES)] == list(range(FILES))


def test_a_missing_state_acknowledgement_fails_the_batch_until_it_arrives(
    spark: Any, dwell: tuple[Path, pd.DataFrame], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    directory, events = dwell
    root, state_root, chk = tmp_path / "out", tmp_path / "state", tmp_path / "chk"
    real_ack = StateRoot.read_ack

    def lost(self: StateRoot, batch: int, partition: int) -> dict[str, Any] | None:
        # Partition 1's acknowledgement of batch 1 never reaches the driver.
        return None if (batch, partition) == (1, 1) else real_ack(self, batch, partition)

    monkeypatch.setattr(StateRoot, "read_ack", lost)
    ks, averages = dwell_averages(spark, directory, state_root)
    sink = ArrowSnapshotSink(
        str(root), output_mode="update", key="user", state=str(state_root), state_timeout=0.5
    )
    with pytest.raises(Exception, match=r"state partition\(s\) \[1\].*did not acknowledge"):
        run(averages, sink, chk, "update")
    assert snapshots.open(str(root)).list() == [0]
    monkeypatch.undo()
    ks, averages = dwell_averages(spark, directory, state_root)
    run(
        averages,
        ArrowSnapshotSink(str(root), output_mode="update", key="user", state=ks),
        chk,
        "update",
    )
    assert as_totals(read_output_arrow(str(root)), "count") == totals(events)
    assert snapshots.open(str(root)).list() == list(range(FILES))
    assert spec_of(str(state_root)).partitions == 3


@pytest.mark.full_priority
def test_a_sigkilled_driver_restarts_to_one_snapshot_per_batch(tmp_path: Path) -> None:
    """The dwell-time job with the sink and state= in a child process,
    SIGKILLed (driver JVM, Python and workers) once a batch has committed,
    while the next runs (a random moment within 1.5 s), restarted
    from its checkpointLocation until the input is consumed: the output and
    state equal pandas, and every batch's manifest names that batch's state
    files and offsets."""
    frames = dwell_frames(files=4, rows=800, users=60, seed=21)
    directory = write_inputs(tmp_path / "events", frames)
    run_dir = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "snapcut.jobs.spark_dwell",
        str(directory),
        str(run_dir / "state"),
        str(run_dir / "chk"),
        str(run_dir / "out"),
        "--sink",
        "arrow",
    ]
    env = child_env(PYSPARK_PYTHON=sys.executable)
    rng = random.Random(20261123)
    kills = 0
    log = tmp_path / "job.log"
    for _ in range(8):
        # stderr to a file: a pipe nobody reads would block Spark's logging.
        with log.open("wb") as err:
            proc = subprocess.Popen(
                args, env=env, process_group=0, stdout=subprocess.DEVNULL, stderr=err
            )
        if kills < 1:
            # Kill once this run has committed a new batch, a little later.
            out = run_dir / "out"
            start = len(list(out.glob("chk-*/manifest.json")))
            while proc.poll() is None:
                if len(list(out.glob("chk-*/manifest.json"))) > start:
                    time.sleep(rng.uniform(0.0, 1.5))
                    break
                time.sleep(0.05)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                kills += 1
                continue
        proc.wait(timeout=300)
        assert proc.returncode == 0, log.read_text()[-3000:]
        break
    else:
        raise AssertionError("the job never finished")
    assert kills == 1
    events = pd.concat(frames, ignore_index=True)
    out = run_dir / "out"
    assert as_totals(read_output_arrow(str(out)), "count") == totals(events)
    state = read_state_arrow(str(run_dir / "state")).to_pylist()
    assert {r["user"]: r["count"] for r in state} == {u: n for u, (n, _) in totals(events).items()}
    # A restart may re-plan the batch the kill interrupted (Spark had not
    # logged its offsets yet) over more files: batches are 0..n, the last
    # one ends at the last file, each names Spark's logged offsets of its id.
    batches = snapshots.open(str(out)).list()
    assert batches == list(range(len(batches))) and len(batches) >= 2
    assert manifest(out, batches[-1])["spark"]["offsets"]["sources"] == [{"logOffset": 3}]
    for b in batches:
        m = manifest(out, b)
        logged = (run_dir / "chk" / "offsets" / str(b)).read_text().splitlines()[2:]
        assert m["spark"]["offsets"]["sources"] == [json.loads(x) for x in logged]
        state_manifest = json.loads((run_dir / "state" / m["state"]["manifest"]).read_text())
        crcs = sorted(f["crc32c"] for f in state_manifest["files"] if f["role"] == "state")
        assert sorted(f["crc32c"] for f in m["state"]["files"]) == crcs


# --- bad input --------------------------------------------------------------


@pytest.mark.both_sessions
def test_bad_options_are_refused(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="output_mode must be one of"):
        ArrowSnapshotSink(str(tmp_path / "a"), output_mode="upsert")
    with pytest.raises(ConfigError, match="'update' needs key="):
        ArrowSnapshotSink(str(tmp_path / "a"), output_mode="update")
    with pytest.raises(ConfigError, match="state= must be"):
        ArrowSnapshotSink(str(tmp_path / "a"), state=42)
    sink = ArrowSnapshotSink(str(tmp_path / "a"), output_mode="update", key="nope")
    with pytest.raises(ConfigError, match=r"key column\(s\) \['nope'\] are not in batch 0"):
        sink(spark.createDataFrame(pd.DataFrame({"user": [1]})), 0)
    assert not (tmp_path / "a" / "chk-00000000").exists()
    with pytest.raises(SnapshotError, match="not a snapcut sink root"):
        read_output_arrow(str(tmp_path / "a"))


def test_a_schema_change_between_batches_is_refused(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "out"
    sink = ArrowSnapshotSink(str(root))
    sink(spark.createDataFrame(pd.DataFrame({"user": [1, 2], "n": [3, 4]})), 0)
    before = committed_files(root)
    added = spark.createDataFrame(pd.DataFrame({"user": [5], "n": [6], "extra": ["x"]}))
    with pytest.raises(ConfigError, match=r"added \['extra'\].*write to a new root"):
        sink(added, 1)
    retyped = spark.createDataFrame(pd.DataFrame({"user": [5], "n": [6.5]}))
    with pytest.raises(ConfigError, match="changed n int64 -> double"):
        ArrowSnapshotSink(str(root))(retyped, 1)
    assert committed_files(root) == before
    assert snapshots.open(str(root)).list() == [0]
    # The same columns in the root's schema are fine.
    sink(retyped.select("user", F.col("n").cast("long")), 1)
    assert read_output_arrow(str(root)).column("n").to_pylist() == [3, 4, 6]


@pytest.mark.both_sessions
def test_a_root_of_another_query_is_refused(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    directory, _ = dwell
    root = tmp_path / "out"
    run(stream(spark, directory), ArrowSnapshotSink(str(root)), tmp_path / "chk-a")
    before = committed_files(root)
    # A new checkpointLocation is a new query (a new id).
    with pytest.raises(Exception, match=r"sink root .* belongs to query"):
        run(stream(spark, directory), ArrowSnapshotSink(str(root)), tmp_path / "chk-b")
    plain = spark.createDataFrame(pd.DataFrame({"user": [1], "dwell_ms": [2]}))
    with pytest.raises(ConfigError, match="belongs to query"):
        ArrowSnapshotSink(str(root))(plain, 99)
    assert committed_files(root) == before


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()})")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (needs root; skipped where mounting is not allowed)."""
    path = tmp_path / "disk"
    _mount_tmpfs(path, "size=2m")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_root_below_a_file_is_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(StorageError, match=r"sink root .* cannot be created"):
        ArrowSnapshotSink(str(a_file / "out"))


def test_a_read_only_root_fails_the_batch(spark: Any, small_disk: Path) -> None:
    root = small_disk / "out"
    root.mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    sink = ArrowSnapshotSink(str(root))
    with pytest.raises(StorageError, match=r"sink root .* is not writable .*Read-only"):
        sink(spark.createDataFrame(pd.DataFrame({"user": [1]})), 0)
    assert list(root.iterdir()) == []


def test_a_full_disk_fails_the_batch_and_the_query_resumes_with_space(
    spark: Any, small_disk: Path, tmp_path: Path
) -> None:
    # Batch 0 is small; batch 1 (~3.6 MB of Arrow) does not fit in 2 MiB.
    frames = dwell_frames(files=2, rows=200, users=10, seed=9)
    frames[1] = dwell_frames(files=1, rows=150_000, users=1000, seed=10)[0]
    directory = write_inputs(tmp_path / "events", frames)
    root, chk = small_disk / "out", tmp_path / "chk"
    with pytest.raises(Exception, match="no space left to stage batch 1"):
        run(stream(spark, directory), ArrowSnapshotSink(str(root)), chk)
    assert snapshots.open(str(root)).list() == [0]
    before = committed_files(root)
    assert event_rows(read_output_arrow(str(root))) == event_rows(frames[0])
    # Space returns: the restarted query re-runs batch 1 and commits it.
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    sink = ArrowSnapshotSink(str(root))
    run(stream(spark, directory), sink, chk)
    assert [r.batch_id for r in sink.reports] == [1]
    assert {k: v for k, v in committed_files(root).items() if k in before} == before
    assert event_rows(read_output_arrow(str(root))) == event_rows(pd.concat(frames))


@pytest.mark.both_sessions
def test_an_unknown_query_id_is_an_error_not_a_default(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path: Path
) -> None:
    """Under Connect foreachBatch is told neither the query id nor the
    checkpointLocation: a sink without checkpoint_location= fails the batch
    naming the fix; a classic session tells the sink the id itself. A
    keyed_state step whose batch nobody announced fails its task the same way."""
    directory, events = dwell
    root, chk = tmp_path / "out", tmp_path / "chk"
    q = (
        stream(spark, directory)
        .writeStream.foreachBatch(ArrowSnapshotSink(str(root)))
        .option("checkpointLocation", str(chk))
        .trigger(availableNow=True)
        .start()
    )
    error = _failure(q)
    if is_connect(spark):
        assert "cannot determine the streaming query's id" in error
        assert "checkpoint_location=" in error
        assert not list(root.glob("chk-*"))
    else:
        assert error == ""
        assert event_rows(read_output_arrow(str(root))) == event_rows(events)
    # A checkpoint_location of another query is refused on both kinds.
    other = tmp_path / "other"
    run(stream(spark, directory), ArrowSnapshotSink(str(tmp_path / "o")), other)
    # (Classic: the running query's id differs; Connect: its logs show that
    # batch 0 is not running there.)
    with pytest.raises(Exception, match=r"belongs to query|already committed batch 0"):
        run(
            stream(spark, directory),
            ArrowSnapshotSink(str(tmp_path / "o2"), checkpoint_location=str(other)),
            tmp_path / "chk2",
        )
    # keyed_state under a foreachBatch function that announces nothing.
    ks = keyed_state(stream(spark, directory), key="user", root=str(tmp_path / "st"), partitions=2)
    counts = ks.aggregate(n="count")
    q = (
        counts.writeStream.foreachBatch(_count_rows)
        .outputMode("update")
        .option("checkpointLocation", str(tmp_path / "chk3"))
        .trigger(availableNow=True)
        .start()
    )
    error = _failure(q)
    if is_connect(spark):
        assert "its task has no batch id" in error
        assert "foreach_batch(func, checkpoint_location=" in error
    else:
        assert error == ""


def _failure(query: Any) -> str:
    """The query's failure as text ("" if it ended well)."""
    try:
        query.awaitTermination()
    except Exception as e:
        return str(e)
    return "" if query.exception() is None else str(query.exception())


def _count_rows(batch_df: Any, batch_id: int) -> None:
    batch_df.count()
