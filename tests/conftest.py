"""Shared fixtures: snapshot roots with known contents.

- `local_root`: written by the Rust store (what the local runtime writes
  through), keyed state with full + diff chains, tombstones, a channel log
  and source offsets; comes with a plain-dict model of every state.
- `spark_root`: the layout of snapcut's Spark helper (batch ids from 0,
  protocol "spark-microbatch", a top-level "spark" object, output files),
  written with the Python writer; also with a dict model.
- `runtime_root`: a real job of the local runtime with durable checkpoints.
- `s3`: a real S3 server on 127.0.0.1 (moto's standalone server, one per
  test module; tests/s3_support.py), for roots on an object store.
- `s3_auth`: moto's S3 server checking credentials (its own process), one
  bucket and one IAM user's key, for missing and refused credentials.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from tests.s3_support import AuthS3Server, S3Server, moto_auth_server, moto_server

from snapcut import Checkpointing, Dataflow, StateTable, snapshots
from snapcut._core import SnapshotStore

SPARK_TESTS = Path(__file__).resolve().parent / "spark"


# The test JVMs (drivers, Connect servers, executors; in this process or a child)
# live for seconds to minutes: C2's JIT compiles and G1's concurrent threads took
# half of their CPU, which C1 only and the serial collector save (what Spark
# computes does not depend on either). They are written once, in tests/jvm-options,
# which scripts/test.sh reads too (adding a class archive,
# scripts/spark_class_archive.py). Set JDK_JAVA_OPTIONS to choose others.
JVM_OPTIONS = (Path(__file__).resolve().parent / "jvm-options").read_text().strip()
os.environ.setdefault("JDK_JAVA_OPTIONS", JVM_OPTIONS)

CONNECT_PORT_GROUP = "spark-connect-port-15002"
LOCAL_CLUSTER_GROUP = "spark-local-cluster"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/spark/ starts Spark: marked ``spark``, so
    ``-m "not spark"`` (``scripts/test.sh --fast``) leaves it out.

    For ``pytest -n N --dist loadgroup`` (N xdist workers) each Spark module
    is one xdist group, so its module-scoped session starts once, on one
    worker; except that everything that starts a local Connect server (the
    ``connect`` session kind, tests marked ``connect_server``) binds port
    15002, so those tests share one group and run one at a time (with the
    tests marked ``connect_port``: a Python process Spark starts must
    connect back within 10 s, so they run ahead of the rest); and the modules
    marked ``local_cluster`` share another (two local-cluster masters started
    in the same second name their applications alike, and their executors
    then share a work directory). Runs first, so xdist sees the groups."""
    for item in items:
        if SPARK_TESTS not in item.path.parents:
            continue
        item.add_marker(pytest.mark.spark)
        params = getattr(item, "callspec", None)
        on_connect = params is not None and params.params.get("spark") == "connect"
        # Marked too, so `-m connect_server` selects the port's tests and
        # `-m connect_port` the whole group (scripts/test.sh runs the port's
        # tests, then the others of the group, in its priority stream, ahead
        # of the rest at nice 10).
        if on_connect:
            item.add_marker(pytest.mark.connect_server)
        if item.get_closest_marker("connect_server") is not None:
            item.add_marker(pytest.mark.connect_port)
        if item.get_closest_marker("connect_port") is not None:
            item.add_marker(pytest.mark.xdist_group(CONNECT_PORT_GROUP))
        elif item.get_closest_marker("local_cluster") is not None:
            item.add_marker(pytest.mark.xdist_group(LOCAL_CLUSTER_GROUP))
        else:
            item.add_marker(pytest.mark.xdist_group(item.path.name))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Session kinds for the Spark test modules: a module that sets
    ``SESSION_KINDS = True`` and defines a module-scoped ``spark`` fixture
    taking ``request.param`` gets every test run on a classic session, and
    the tests marked ``both_sessions`` once more on Spark Connect (the same
    assertions). Classic is always parameter 0, so pytest runs a module's
    classic cases on one session, then its Connect cases on one Connect
    server (one kind at a time per process)."""
    if "spark" not in metafunc.fixturenames or not getattr(metafunc.module, "SESSION_KINDS", False):
        return
    kinds = ["classic", "connect"]
    if metafunc.definition.get_closest_marker("both_sessions") is None:
        kinds = kinds[:1]
    metafunc.parametrize("spark", kinds, indirect=True, scope="module")


Task = tuple[str, int]
Model = dict[int, dict[Task, dict[Any, Any]]]
"""checkpoint id → task → key → the row's other values (a tuple)."""


@dataclass
class Root:
    path: Path
    model: Model
    outputs: dict[int, dict[int, list[dict[str, Any]]]] = field(default_factory=dict)
    """Spark roots: batch → partition → output rows."""

    def name(self, kind: str) -> str:
        """How a user names this root: a local path or a file:// URI."""
        return str(self.path) if kind == "local" else self.path.as_uri()

    def open(self, kind: str) -> dict[str, Any]:
        """Keyword arguments naming the root for the Python API, by kind."""
        if kind == "subtree":
            sub = pafs.SubTreeFileSystem(str(self.path.parent), pafs.LocalFileSystem())
            return {"root": self.path.name, "filesystem": sub}
        return {"root": self.name(kind)}


# --- a root written by the Rust store ---

LOCAL_SCHEMA = pa.schema(
    [pa.field("k", pa.int64(), nullable=False), ("v", pa.int64()), ("blob", pa.binary())]
)


def build_local_root(path: Path, n: int = 6, full_every: int = 3) -> Root:
    """Checkpoints 1..n of two keyed subtasks of "agg" (full every
    `full_every`, deletes on even ids) and a source "src"."""
    store = SnapshotStore(path, retain=1_000)
    tables = {s: StateTable(LOCAL_SCHEMA, "k", full_every=full_every) for s in (0, 1)}
    dicts: dict[int, dict[int, tuple[int, bytes]]] = {0: {}, 1: {}}
    model: Model = {}
    for cid in range(1, n + 1):
        for s, table in tables.items():
            keys = [k for k in range(cid * 3, cid * 3 + 6) if k % 2 == s]
            if cid == 1:
                # A key never changed again, so no later checkpoint rewrites
                # every key (that one would be stored full, not as a diff).
                keys.append(1_000_000 + s)
            # Some updates change only v, some only blob: a diff must look at each column.
            values = [(k + cid // 2 * 100, bytes([k % 256, cid * (k % 3 == 0)])) for k in keys]
            table.update(
                pa.record_batch(
                    [keys, [v for v, _ in values], [b for _, b in values]], schema=LOCAL_SCHEMA
                )
            )
            dicts[s].update(zip(keys, values, strict=True))
            if cid % 2 == 0:
                gone = sorted(dicts[s])[:1]
                table.delete(gone)
                for k in gone:
                    del dicts[s][k]
            _, kind, batch = table.checkpoint(cid)
            channels = [(1, "agg<-loop", 0, pa.table({"x": [cid, cid + 1]}))] if s == 0 else []
            store.task_snapshot(
                cid,
                "agg",
                s,
                state=(kind, None if kind == "full" else cid - 1, batch),
                channels=channels,
                alignment_nanos=1_500_000 * (s + 1),
            )
        store.task_snapshot(cid, "src", 0, source_offset=cid * 10)
        store.commit(cid, protocol="aligned", graph_fingerprint="g1", started_ms=cid * 1000)
        model[cid] = {("agg", s): dict(d) for s, d in dicts.items()}
    return Root(path, model)


@pytest.fixture
def local_root(tmp_path: Path) -> Root:
    return build_local_root(tmp_path / "local")


# --- a root in the layout of snapcut's Spark helper ---

SPARK_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        ("n", pa.int64()),
        ("recent", pa.list_(pa.int64())),
    ]
)


def build_spark_root(
    path: Path, batches: int = 4, partitions: int = 2, full_every: int = 2
) -> Root:
    """Batches 0..batches-1 of a stateful query over `partitions` state
    partitions ("counts"), each with a Spark-style manifest and output files."""
    w = snapshots.SnapshotWriter(path.as_uri())
    state: dict[int, dict[str, tuple[int, list[int]]]] = {p: {} for p in range(partitions)}
    model: Model = {}
    outputs: dict[int, dict[int, list[dict[str, Any]]]] = {}
    for b in range(batches):
        files = []
        outputs[b] = {}
        for p in range(partitions):
            before = dict(state[p])
            for i in range(b, b + 3):
                if i % partitions == p:
                    n, recent = state[p].get(f"u{i}", (0, []))
                    state[p][f"u{i}"] = (n + 1, [*recent, b][-2:])
            if b >= 2 and f"u{b - 2}" in state[p]:
                del state[p][f"u{b - 2}"]
            full = b % full_every == 0
            if full:
                rows = [(k, n, r, False) for k, (n, r) in sorted(state[p].items())]
            else:
                changed = [k for k in state[p] if before.get(k) != state[p][k]]
                gone = [k for k in before if k not in state[p]]
                rows = [(k, *state[p][k], False) for k in sorted(changed)]
                rows += [(k, None, None, True) for k in sorted(gone)]
            cols = list(zip(*rows, strict=True)) if rows else [(), (), (), ()]
            table = pa.table(
                [pa.array(c, f.type) for c, f in zip(cols[:3], SPARK_SCHEMA, strict=True)],
                schema=SPARK_SCHEMA,
            )
            if not full:
                table = table.append_column("__deleted", pa.array(cols[3], pa.bool_()))
            kind, base = ("full", None) if full else ("diff", b - 1)
            files.append(w.write_state(b, "counts", p, table, key="key", kind=kind, base=base))
            outputs[b][p] = [
                {"key": k, "n": n} for k, (n, _) in sorted(state[p].items()) if k not in before
            ]
        manifest = w.commit(
            b,
            files,
            source_offsets={("kafka", 0): 100 * (b + 1)},
            protocol="spark-microbatch",
            graph_fingerprint="spark:q-1",
        )
        # What the Spark helper adds: the query's facts and the batch's outputs.
        for p, rows_p in outputs[b].items():
            out = pa.Table.from_pylist(
                rows_p, schema=pa.schema([("key", pa.string()), ("n", pa.int64())])
            )
            entry = w._write(b, f"output-{p}.arrow", out)
            entry.update(role="output", partition=p)
            manifest["files"].append(entry)
        manifest["spark"] = {
            "query_id": "q-1",
            "batch_id": b,
            "partitions": partitions,
            "watermark_ms": 1_000 * b,
        }
        (path / snapshots.checkpoint_dir_name(b) / snapshots.MANIFEST_FILE).write_text(
            json.dumps(manifest, indent=2)
        )
        model[b] = {("counts", p): {k: (n, r) for k, (n, r) in state[p].items()} for p in state}
    return Root(path, model, outputs)


@pytest.fixture
def spark_root(tmp_path: Path) -> Root:
    return build_spark_root(tmp_path / "spark")


# --- a root written by a job of the local runtime ---

USERS = 50


def runtime_batches(delay: float) -> Iterator[pa.RecordBatch]:
    """Every user once, then slowly (so that checkpoints fall in between) a few."""
    yield pa.RecordBatch.from_pydict({"user": list(range(USERS)), "dwell_ms": [1] * USERS})
    for i in range(40):
        time.sleep(delay)
        yield pa.RecordBatch.from_pydict({"user": [i % 5, USERS + i], "dwell_ms": [i, 2]})


def runtime_expected() -> dict[int, tuple[int, int]]:
    """(count, total) per user after every batch."""
    out: dict[int, tuple[int, int]] = {}
    for b in runtime_batches(0):
        for u, d in zip(b["user"].to_pylist(), b["dwell_ms"].to_pylist(), strict=True):
            c, t = out.get(u, (0, 0))
            out[u] = (c + 1, t + d)
    return out


@pytest.fixture(scope="session")
def runtime_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runtime") / "chk"
    flow = Dataflow(parallelism=2)
    src = flow.from_iterable(lambda: runtime_batches(0.003))
    src.key_by("user").aggregate(count="count", total=("sum", "dwell_ms")).collect("out")
    cfg = Checkpointing(interval=0.01, min_pause=0.002, full_every=3, retained=1_000)
    flow.run(cfg, checkpoint_dir=root)
    return root


# --- a real S3 server ---


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    """moto's S3 server on a free port of 127.0.0.1 for one test module, the
    AWS_* variables of S3Server.env() set meanwhile; ``s3.bucket()`` makes a
    fresh bucket, ``s3.filesystem()`` / ``s3.uri(path)`` name it."""
    with moto_server() as server:
        yield server


@pytest.fixture(scope="module")
def s3_auth() -> Iterator[AuthS3Server]:
    """moto's S3 server with request authentication on (its own process),
    for one test module: one bucket, one IAM user's key that may use it
    (tests/s3_support.py)."""
    with moto_auth_server() as server:
        yield server
