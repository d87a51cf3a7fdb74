"""Shared Spark test setup: sessions, input files, and running a streaming
query to completion with every micro-batch's output collected by batch id."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Python workers unpickle the tests' functions by module name: they need the
# test directories (pytest imports test modules from there, tests/spark/ and
# the other package folders) and the repository.
_TESTS = Path(__file__).resolve().parent
_PATHS = [
    str(_TESTS),
    *(str(d) for d in sorted(_TESTS.iterdir()) if d.is_dir() and any(d.glob("test_*.py"))),
    str(_TESTS.parent),
]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [
        *_PATHS,
        *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in _PATHS),
    ]
)

from pyspark.sql import DataFrame, SparkSession  # noqa: E402 (after PYTHONPATH)

from snapcut.spark import foreach_batch, metrics  # noqa: E402
from snapcut.spark.session_kind import is_connect  # noqa: E402, F401 (the tests' import)

EVENTS_SCHEMA = "user long, dwell_ms long, ts timestamp"


SESSION_KINDS = ("classic", "connect")
"""A classic session holds a SparkContext in this process; a Connect session
talks gRPC to a server (here a local one, ``remote("local[2]")``, started in
this process's JVM: one of the two kinds at a time)."""


def start_session(master: str = "local[2]", kind: str = "classic", **conf: str) -> SparkSession:
    """A session for one test module. ``local[2]``: two cores, one attempt per
    task, so a query that is meant to fail fails at once: each retry starts a
    new Python worker, and under CI's load a refused query's four attempts
    took 70 s (2.4 to 4.7 s alone). Modules that inject task failures pass
    ``local[2,4]`` (up to four attempts per task). ``kind``: "classic" or
    "connect" (the same master, behind a local Connect server)."""
    if kind not in SESSION_KINDS:
        raise ValueError(f"kind must be one of {SESSION_KINDS}, got {kind!r}")
    builder = SparkSession.builder
    builder = builder.remote(master) if kind == "connect" else builder.master(master)
    builder = (
        builder.appName("snapcut-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
    )
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    if kind == "classic":
        spark.sparkContext.setLogLevel("ERROR")
    return spark


CONNECT_ENV = (
    "SPARK_CONNECT_MODE_ENABLED",
    "SPARK_REMOTE",
    "SPARK_LOCAL_REMOTE",
    "SPARK_CONNECT_AUTHENTICATE_TOKEN",
)


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child that starts its own Spark:
    without what a running local Connect server put there (a child seeing
    SPARK_CONNECT_MODE_ENABLED would look for a Connect URL)."""
    env = {k: v for k, v in os.environ.items() if k not in CONNECT_ENV}
    return {**env, **extra}


def dwell_frames(
    files: int, rows: int, users: int, seed: int = 7, start_s: int = 0, drift: int = 0
) -> list[pd.DataFrame]:
    """`files` frames of (user, dwell_ms, ts): event time grows file by file.
    `drift` moves file i's users up by i * drift, so a later batch leaves
    some keys untouched (its state is then a diff, not the whole table)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for i in range(files):
        user = rng.integers(0, users, rows) + i * drift
        dwell = rng.integers(1, 10_000, rows)
        secs = start_s + i * 60 + rng.integers(0, 60, rows)
        ts = pd.to_datetime(secs, unit="s", utc=True)
        out.append(pd.DataFrame({"user": user, "dwell_ms": dwell, "ts": ts}))
    return out


def write_inputs(directory: Path, frames: list[pd.DataFrame]) -> Path:
    """One parquet file per frame, named and timed so the file source reads
    them in order: it orders by modification time, and files written within
    one tick of the kernel's coarse file clock would share it (then Spark may
    read part 2 before part 1), so each file gets its own second."""
    directory.mkdir(parents=True, exist_ok=True)
    first = time.time() - len(frames) - 1
    for i, frame in enumerate(frames):
        tmp = directory / f".part-{i:05d}.parquet.tmp"
        frame.to_parquet(tmp, index=False, coerce_timestamps="us", allow_truncated_timestamps=True)
        path = directory / f"part-{i:05d}.parquet"
        tmp.rename(path)
        os.utime(path, (first + i, first + i))
    return directory


def stream(spark: SparkSession, directory: Path, schema: str = EVENTS_SCHEMA) -> DataFrame:
    """The input directory as a stream, one file per micro-batch."""
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(directory))


def run_to_end(
    df: DataFrame,
    checkpoint: Path,
    output_mode: str = "update",
    stop_after: int | None = None,
    progress: list[Any] | None = None,
) -> dict[int, pa.Table]:
    """Runs the query with an availableNow trigger; every batch's output by id.

    ``stop_after``: stop once that many batches ran (Spark's
    ``applyInPandasWithState`` with processing-time timeouts runs data-less
    batches for ever, even under availableNow). Each batch is written to a
    file beside the checkpoint: under Spark Connect ``foreachBatch`` runs in
    the server's Python worker, not in this process; ``foreach_batch`` gives
    the keyed_state steps of the plan the batch's id there. ``progress``:
    a list that gets the query's ``recentProgress``."""
    # A directory per run: a restart from the same checkpoint returns its own batches.
    out = checkpoint.parent / f"{checkpoint.name}-batches-{uuid.uuid4().hex[:8]}"
    out.mkdir(parents=True)
    q = (
        df.writeStream.foreachBatch(
            foreach_batch(BatchFiles(str(out)), checkpoint_location=str(checkpoint))
        )
        .outputMode(output_mode)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    if stop_after is not None:
        while q.isActive and len(list(out.glob("*.arrow"))) < stop_after:
            time.sleep(0.05)
        q.stop()
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    if progress is not None:
        progress.extend(q.recentProgress)
    return read_batch_files(out)


class BatchFiles:
    """A ``foreachBatch`` function writing each batch to ``<dir>/<id>.arrow``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        import pyarrow.feather as feather

        path = Path(self.directory) / f"{batch_id:06d}.arrow"
        tmp = path.with_suffix(".tmp")
        feather.write_feather(batch_df.toArrow(), tmp, compression="uncompressed")
        tmp.rename(path)


def observed_progress(df: DataFrame, checkpoint: Path, name: str) -> list[dict[str, Any]]:
    """Runs the query to the end (availableNow, into Spark's noop sink, on
    classic and Connect alike); each batch's observed metrics of the
    keyed_state step ``name``."""
    q = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    got = [metrics.observed(p, name) for p in q.recentProgress]
    assert all(g is not None for g in got), got
    return [g for g in got if g is not None]


def read_batch_files(directory: Path) -> dict[int, pa.Table]:
    import pyarrow.feather as feather

    return {int(p.stem): feather.read_table(p) for p in sorted(directory.glob("*.arrow"))}


def rows_of(table: pa.Table, sort: list[str]) -> list[dict[str, Any]]:
    return table.sort_by([(c, "ascending") for c in sort]).to_pylist()


def concat(batches: dict[int, pa.Table], ids: Callable[[int], bool] = lambda _: True) -> pa.Table:
    chosen = [t for b, t in sorted(batches.items()) if ids(b) and t.num_rows]
    if not chosen:
        raise AssertionError("no output rows in the chosen batches")
    return pa.concat_tables(chosen)


class NoRenameHandler(pafs.FileSystemHandler):
    """The local filesystem seen as an object store: a ``PyFileSystem`` (so
    snapcut does not take it for a local path), directories cannot be moved.
    Picklable, so executors get it too."""

    def __init__(self) -> None:
        self.fs = pafs.LocalFileSystem()

    def __reduce__(self) -> tuple[Any, ...]:
        return (NoRenameHandler, ())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NoRenameHandler)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "norename"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(paths)  # type: ignore[no-any-return]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(selector)  # type: ignore[no-any-return]

    def create_dir(self, path: str, recursive: bool) -> None:
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("refusing to empty /")

    def delete_file(self, path: str) -> None:
        self.fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        if self.fs.get_file_info(src).type == pafs.FileType.Directory:
            raise OSError(f"an object store cannot move directory {src}")
        self.fs.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return self.fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self.fs.open_append_stream(path, metadata=metadata)


def object_store() -> pafs.PyFileSystem:
    return pafs.PyFileSystem(NoRenameHandler())
