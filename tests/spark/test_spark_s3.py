"""State root and sink on S3 (a real S3 server on 127.0.0.1: moto's
standalone server, the ``s3`` fixture of conftest.py), through pyarrow's
``S3FileSystem`` and through ``s3://...?endpoint_override=...`` URIs.

The query is the dwell-time aggregate with ``keyed_state`` and
``ArrowSnapshotSink(state=...)``; the same query on local roots is the
reference. On S3 there is no rename: files go first, the manifest last, and
readers go through the manifests. Checked: the same output, state and state
bytes as locally; task failures mid-batch; driver crashes before and in the
middle of a commit (no visible partial batch, staged files cleaned on
restart); ``snapcut snapshots`` on the S3 roots; clear errors for a missing
bucket and an unreachable endpoint."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from table_sink import fail_driver_at
from tests.s3_support import SECRET_KEY, S3Server, closed_port
from tests.spark_support import dwell_frames, start_session, stream, write_inputs

from snapcut import ObjectStoreError, StorageError, snapshots
from snapcut._fs import redact
from snapcut.cli import main
from snapcut.spark import (
    ArrowSnapshotSink,
    keyed_state,
    read_output,
    read_output_arrow,
    read_state,
    read_state_arrow,
)
from snapcut.spark import failpoints as fp
from snapcut.spark.roots import schema_bytes
from snapcut.spark.sink import commit as sink_module
from snapcut.spark.state.root import StateRoot
from snapcut.spark.state.spec import RootSpec

FILES = 3
PARTITIONS = 3
ROWS = 500
SINK_KEY = re.compile(
    r"_snapcut_(sink|owner)\.json"
    r"|chk-\d{8}/(manifest\.json|sources\.arrow|part-\d{5}(-\d+)?\.arrow)"
)
"""The only objects of a sink root without staged or partial batches."""
STATE_KEY = re.compile(
    r"_snapcut_(state|owner)\.json"
    r"|chk-\d{8}/(manifest\.json|sources\.arrow|state-\d\.(state\.arrow|state\.bloom|ack\.json))"
)
"""The only objects of a state root (no temp files, nothing else; a diff's
bloom filter beside it, format 3)."""


@pytest.fixture(scope="module")
def points(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("failpoints") / "points"
    path.write_text("")
    return path


@pytest.fixture(scope="module")
def spark(s3: S3Server, points: Path) -> Iterator[Any]:
    # The AWS variables (set by the s3 fixture) reach the Python workers both
    # by inheritance and by executorEnv: URIs need them there.
    env = {f"spark.executorEnv.{k}": v for k, v in s3.env().items()}
    session = start_session(
        "local[2,4]", **{"spark.executorEnv.SNAPCUT_SPARK_FAILPOINTS": f"@{points}", **env}
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def dwell(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    frames = dwell_frames(files=FILES, rows=ROWS, users=40, seed=13, drift=20)
    directory = write_inputs(tmp_path_factory.mktemp("dwell") / "events", frames)
    return directory, pd.concat(frames, ignore_index=True)


@dataclass
class Roots:
    """A state root and a sink root, named as a user would (URI or path +
    filesystem), and how to read them."""

    state: str
    out: str
    filesystem: Any = None

    def kw(self) -> dict[str, Any]:
        return {} if self.filesystem is None else {"filesystem": self.filesystem}


def run_query(
    spark: Any,
    directory: Path,
    roots: Roots,
    checkpoint: Path,
    compaction: bool = False,
    full_every: int = 2,
) -> ArrowSnapshotSink:
    """The dwell-time aggregate, state and sink as one global snapshot per batch.
    Its commits write a full every `full_every` batches on either root
    (without `compaction`), so the local run's state files are the same
    bytes as the S3 run's."""
    ks = keyed_state(
        stream(spark, directory),
        "user",
        roots.state,
        PARTITIONS,
        full_every=full_every,
        compaction=compaction,
        **roots.kw(),
    )
    averages = ks.aggregate(count="count", total=("sum", "dwell_ms"), avg=("mean", "dwell_ms"))
    sink = ArrowSnapshotSink(roots.out, output_mode="update", key="user", state=ks, **roots.kw())
    q = (
        averages.writeStream.foreachBatch(sink)
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    return sink


@pytest.fixture(scope="module")
def local(
    spark: Any, dwell: tuple[Path, pd.DataFrame], tmp_path_factory: pytest.TempPathFactory
) -> Roots:
    """The reference: the same query on local roots."""
    base = tmp_path_factory.mktemp("local")
    roots = Roots(str(base / "state"), str(base / "out"))
    run_query(spark, dwell[0], roots, base / "chk")
    return roots


@pytest.fixture(scope="module")
def on_s3(
    spark: Any,
    s3: S3Server,
    dwell: tuple[Path, pd.DataFrame],
    tmp_path_factory: pytest.TempPathFactory,
) -> Roots:
    """The query with both roots on S3, given as S3FileSystem + path."""
    bucket = s3.bucket()
    roots = Roots(f"{bucket}/dwell/state", f"{bucket}/dwell/out", s3.filesystem())
    run_query(spark, dwell[0], roots, tmp_path_factory.mktemp("s3") / "chk")
    return roots


def totals(events: pd.DataFrame) -> dict[int, tuple[int, int]]:
    g = events.groupby("user")["dwell_ms"].agg(["count", "sum"])
    return {int(u): (int(r["count"]), int(r["sum"])) for u, r in g.iterrows()}


def as_totals(table: pa.Table) -> dict[int, tuple[int, int]]:
    rows = table.to_pylist()
    out = {r["user"]: (r["count"], r["total"]) for r in rows}
    assert len(out) == len(rows), "one row per key"
    return out


def by_user(table: pa.Table) -> list[dict[str, Any]]:
    return table.sort_by("user").to_pylist()


def state_crcs(root: str, filesystem: Any = None) -> dict[int, list[tuple[str, int, int]]]:
    """Per committed batch: (file, bytes, crc32c) of every state file."""
    snaps = snapshots.open(root, filesystem=filesystem)
    return {
        c.id: sorted((f["path"], f["bytes"], f["crc32c"]) for f in c.files if f["role"] == "state")
        for c in snaps
    }


def assert_matches_reference(
    roots: Roots, local: Roots, events: pd.DataFrame, batches: list[int] | None = None
) -> None:
    """Output, state, and the state files' bytes equal the local run's (and pandas)."""
    kw = roots.kw()
    want = batches if batches is not None else list(range(FILES))
    assert snapshots.open(roots.out, **kw).list() == want
    assert snapshots.open(roots.state, **kw).list() == want
    out = read_output_arrow(roots.out, **kw)
    assert by_user(out) == by_user(read_output_arrow(local.out))
    assert as_totals(out) == totals(events)
    state = read_state_arrow(roots.state, **kw)
    assert by_user(state) == by_user(read_state_arrow(local.state))
    # Deterministic state bytes: the same files as on the local root.
    assert state_crcs(roots.state, **kw) == {
        b: v for b, v in state_crcs(local.state).items() if b in want
    }
    for b in want:
        mine = snapshots.open(roots.out, **kw)[b].manifest
        theirs = snapshots.open(local.out)[b].manifest
        assert mine["output"]["rows"] == theirs["output"]["rows"] > 0
        assert mine["spark"]["offsets"]["sources"] == [{"logOffset": b}]
        assert [f["crc32c"] for f in mine["state"]["files"]] == [
            f["crc32c"] for f in theirs["state"]["files"]
        ]
        assert mine["state"]["batch"] == b
    assert snapshots.open(roots.out, **kw).verify() == {b: None for b in want}
    assert snapshots.open(roots.state, **kw).verify() == {b: None for b in want}


def bucket_path(root: str) -> str:
    """bucket/prefix of a root named by path or s3:// URI."""
    return root.removeprefix("s3://").split("?", 1)[0].rsplit("@", 1)[-1]


def object_keys(s3: S3Server, root: str) -> list[str]:
    """The keys under a root named by path (bucket/prefix) or s3:// URI."""
    return s3.keys(bucket_path(root))


def assert_only_committed_files(s3: S3Server, roots: Roots) -> None:
    """Nothing staged, no temp files, no partial batch: every key is a root
    file or a file of a committed batch named by its manifest."""
    fs = s3.filesystem()
    for root, pattern in ((roots.out, SINK_KEY), (roots.state, STATE_KEY)):
        keys = object_keys(s3, root)
        strays = [k for k in keys if not pattern.fullmatch(k)]
        assert strays == [], f"{root}: unexpected objects {strays}"
        snaps = snapshots.open(bucket_path(root), filesystem=fs)
        assert snaps.partial() == []
        if pattern is SINK_KEY:
            for c in snaps:
                named = {f"{snapshots.checkpoint_dir_name(c.id)}/{f['path']}" for f in c.files}
                here = {k for k in keys if k.startswith(snapshots.checkpoint_dir_name(c.id))}
                assert here - named == {f"{snapshots.checkpoint_dir_name(c.id)}/manifest.json"}


# --- the same query, local and on S3 ---------------------------------------------


def test_state_and_sink_on_s3_match_the_same_query_on_local_roots(
    spark: Any,
    s3: S3Server,
    dwell: tuple[Path, pd.DataFrame],
    local: Roots,
    on_s3: Roots,
) -> None:
    _, events = dwell
    assert_matches_reference(on_s3, local, events)
    assert_only_committed_files(s3, on_s3)
    # The same roots named by s3:// URI (credentials from the environment).
    as_uri = Roots(s3.uri(on_s3.state), s3.uri(on_s3.out))
    assert_matches_reference(as_uri, local, events)
    # Executors read them too (the filesystem travels pickled into the tasks).
    for roots in (on_s3, as_uri):
        assert by_user(read_output(spark, roots.out, **roots.kw()).toArrow()) == by_user(
            read_output_arrow(local.out)
        )
        assert by_user(read_state(spark, roots.state, **roots.kw()).toArrow()) == by_user(
            read_state_arrow(local.state)
        )
    # The sink's manifest names the state root it snapshotted, and no secret.
    manifest = snapshots.open(on_s3.out, filesystem=on_s3.filesystem).latest().manifest
    assert manifest["state"]["root"] == on_s3.state
    assert SECRET_KEY not in json.dumps(manifest)


def test_with_its_runs_merged_off_the_commit_a_query_on_s3_matches(
    spark: Any,
    s3: S3Server,
    dwell: tuple[Path, pd.DataFrame],
    local: Roots,
    tmp_path: Path,
) -> None:
    """Compaction on (the default): the workers merge the S3 root's runs and
    store each merge in the checkpoint of the newest run it merged, which a
    later commit names there; whichever way each batch went (a merge adopted,
    or a full at the cap), output and state equal the local run's and
    pandas', and every batch verifies."""
    directory, events = dwell
    bucket = s3.bucket()
    roots = Roots(f"{bucket}/merged/state", f"{bucket}/merged/out", s3.filesystem())
    run_query(spark, directory, roots, tmp_path / "chk", compaction=True, full_every=1)
    kw = roots.kw()
    assert snapshots.open(roots.state, **kw).list() == list(range(FILES))
    out = read_output_arrow(roots.out, **kw)
    assert by_user(out) == by_user(read_output_arrow(local.out))
    assert as_totals(out) == totals(events)
    assert by_user(read_state_arrow(roots.state, **kw)) == by_user(read_state_arrow(local.state))
    assert snapshots.open(roots.state, **kw).verify() == {b: None for b in range(FILES)}
    # Batch 1 wrote diffs (without compaction, `full_every=1` writes fulls):
    # the workers had a compactor of the S3 root.
    entries = snapshots.open(roots.state, **kw)[1].files
    assert {f["kind"] for f in entries if f["role"] == "state"} == {"diff"}


def test_task_failures_mid_batch_on_s3_still_match(
    spark: Any,
    s3: S3Server,
    dwell: tuple[Path, pd.DataFrame],
    local: Roots,
    points: Path,
    tmp_path: Path,
) -> None:
    directory, events = dwell
    bucket = s3.bucket()
    # URIs that carry their credentials: the tasks open them as they are.
    roots = Roots(
        s3.uri(f"{bucket}/state", credentials=True), s3.uri(f"{bucket}/out", credentials=True)
    )
    # Batch 1: partition 0's task raises after writing its state file, and
    # partition 2's worker is SIGKILLed after acknowledging; batch 2:
    # partition 1's sink task raises after staging its output file.
    points.write_text(
        "state.after_write:1:0:raise:0,state.after_ack:1:2:kill:0,sink.after_stage:2:1:raise:0"
    )
    try:
        run_query(spark, directory, roots, tmp_path / "chk")
    finally:
        points.write_text("")
    assert_matches_reference(roots, local, events)
    assert_only_committed_files(s3, roots)
    retried = snapshots.open(roots.out)[2].manifest
    attempts = {f["partition"]: f["attempt"] for f in retried["files"] if f["role"] == "output"}
    assert attempts[1] >= 1 and attempts[0] == 0
    acks = snapshots.open(roots.state)[1].manifest["spark"]
    assert acks["rows_in"] == ROWS
    # The credentials are in no manifest; the sink names the state root masked.
    for c in snapshots.open(roots.out):
        assert SECRET_KEY not in json.dumps(c.manifest)
        assert c.manifest["state"]["root"] == redact(roots.state)
        assert c.manifest["state"]["root"].startswith("s3://***@")


def test_a_restart_after_crashed_commits_shows_no_partial_batch_and_cleans_up(
    spark: Any,
    s3: S3Server,
    dwell: tuple[Path, pd.DataFrame],
    local: Roots,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    directory, events = dwell
    bucket = s3.bucket()
    roots = Roots(f"{bucket}/state", f"{bucket}/out", s3.filesystem())
    chk = tmp_path / "chk"
    first = read_output_arrow(local.out, batch=0)
    # 1. The driver dies after batch 1 is staged, before its commit.
    fail_driver_at(monkeypatch, "sink.before_commit", 1)
    with pytest.raises(Exception, match=r"injected driver failure at sink\.before_commit"):
        run_query(spark, directory, roots, chk)
    monkeypatch.undo()
    out = snapshots.open(roots.out, filesystem=roots.filesystem)
    assert (out.list(), out.partial()) == ([0], [])
    staged = [k for k in object_keys(s3, roots.out) if k.startswith("_staging/")]
    assert staged and all(k.startswith("_staging/00000001/part-") for k in staged)
    assert by_user(read_output_arrow(roots.out, filesystem=roots.filesystem)) == by_user(first)
    # 2. Restarted, the driver dies in the middle of batch 1's commit: its
    # files are in chk-00000001/, its manifest is not.
    real_commit = sink_module.SnapshotWriter.commit

    def crash(self: Any, checkpoint_id: int, *args: Any, **kwargs: Any) -> Any:
        if checkpoint_id == 1 and self.root.endswith("/out"):
            raise fp.InjectedFailure("injected failure before batch 1's manifest")
        return real_commit(self, checkpoint_id, *args, **kwargs)

    monkeypatch.setattr(sink_module.SnapshotWriter, "commit", crash)
    with pytest.raises(Exception, match="before batch 1's manifest"):
        run_query(spark, directory, roots, chk)
    monkeypatch.undo()
    out = snapshots.open(roots.out, filesystem=roots.filesystem)
    assert (out.list(), out.partial()) == ([0], [1])
    keys = object_keys(s3, roots.out)
    assert any(re.fullmatch(r"chk-00000001/part-\d{5}\.arrow", k) for k in keys)
    assert "chk-00000001/manifest.json" not in keys
    assert not any(k.startswith("_staging/") for k in keys)  # moved, not copied
    # Readers see batch 0 only; the partial batch is listed as such.
    assert by_user(read_output_arrow(roots.out, filesystem=roots.filesystem)) == by_user(first)
    rows = snapshots.list_checkpoints(roots.out, filesystem=roots.filesystem)
    assert [(r.id, r.status) for r in rows] == [(0, "complete"), (1, "partial")]
    # What a crash with more tasks (or in an earlier attempt) leaves besides:
    # files the re-run does not overwrite.
    fs = s3.filesystem()
    for stray in ("chk-00000001/part-00009.arrow", "_staging/00000001/part-00009-0-a0-x.arrow"):
        with fs.open_output_stream(f"{roots.out}/{stray}") as f:
            f.write(b"left by a crashed attempt")
    # 3. Restarted cleanly: batch 1 re-runs, the partial directory and staged
    # files are gone, and everything equals the local run.
    sink = run_query(spark, directory, roots, chk)
    assert [(r.batch_id, r.committed) for r in sink.reports] == [(1, True), (2, True)]
    assert_matches_reference(roots, local, events)
    assert_only_committed_files(s3, roots)


# --- snapcut snapshots on the S3 roots (issue 11) ---------------------------------


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["snapshots", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_snapshots_cli_lists_verifies_shows_and_exports_s3_roots(
    s3: S3Server,
    on_s3: Roots,
    local: Roots,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    state_uri, out_uri = s3.uri(on_s3.state), s3.uri(on_s3.out)
    code, text, err = cli(capsys, "list", state_uri, "--json")
    assert code == 0, err
    rows = json.loads(text)
    assert [(r["id"], r["status"], r["engine"]) for r in rows] == [
        (b, "complete", "spark") for b in range(FILES)
    ]
    assert [r["chain"] for r in rows] == [[0], [0, 1], [2]]
    code, text, err = cli(capsys, "list", out_uri)
    assert code == 0, err
    assert f"{FILES} checkpoints under" in text and "partial" not in text
    for uri in (state_uri, out_uri):
        code, text, err = cli(capsys, "verify", uri, "--all")
        assert code == 0, err
        assert f"{FILES} checkpoints intact under" in text and "BROKEN" not in text
    code, text, err = cli(capsys, "show", out_uri, "1", "--json")
    assert code == 0, err
    shown = json.loads(text)
    assert shown["manifest"]["checkpoint_id"] == 1
    assert shown["manifest"]["state"]["batch"] == 1
    # export: the state (and a sink batch's output) as parquet, read back.
    code, text, err = cli(capsys, "export", state_uri, "--to", str(tmp_path / "state"))
    assert code == 0, err
    exported = pq.read_table(tmp_path / "state" / "state")
    want = read_state_arrow(local.state)
    assert exported.num_rows == want.num_rows
    assert sorted(exported.column("user").to_pylist()) == sorted(want.column("user").to_pylist())
    code, text, err = cli(capsys, "export", out_uri, "0", "--to", str(tmp_path / "out0"))
    assert code == 0, err
    got = pq.read_table(tmp_path / "out0" / "output").sort_by("user")
    assert got.to_pylist() == read_output_arrow(local.out, batch=0).sort_by("user").to_pylist()
    # prune --dry-run names what it would remove (0 and 1: batch 2 is a full) and
    # removes nothing.
    code, text, err = cli(capsys, "prune", state_uri, "--keep", "1", "--dry-run")
    assert code == 0, err
    assert "would remove 2 checkpoints: 0, 1" in text
    assert snapshots.open(state_uri).list() == list(range(FILES))
    # A corrupt object on S3 is found and named; verify exits 1.
    fs = s3.filesystem()
    victim = f"{on_s3.out}/chk-00000001/part-00000.arrow"
    with fs.open_input_stream(victim) as f:
        good = f.read()
    try:
        with fs.open_output_stream(victim) as f:
            f.write(good[:-20] + bytes(b ^ 0xFF for b in good[-20:]))
        code, text, err = cli(capsys, "verify", out_uri, "1")
        assert code == 1
        assert "part-00000.arrow" in text and "checksum" in text
    finally:
        with fs.open_output_stream(victim) as f:
            f.write(good)
    assert snapshots.open(out_uri).verify() == {b: None for b in range(FILES)}
    # Credentials in the URI work, and are masked in what is printed.
    with_keys = s3.uri(on_s3.out, credentials=True)
    assert SECRET_KEY in with_keys
    for command in ("list", "verify"):
        code, text, err = cli(capsys, command, with_keys)
        assert code == 0, err
        assert SECRET_KEY not in text + err and "s3://***@" in text


# --- errors that name the problem and the fix -----------------------------------


def test_a_missing_bucket_and_an_unreachable_endpoint_are_named(
    s3: S3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = s3.uri("no-such-bucket-snapcut/out")
    with pytest.raises(ObjectStoreError, match=r"bucket 'no-such-bucket-snapcut' does not exist"):
        ArrowSnapshotSink(missing)
    with pytest.raises(ObjectStoreError, match=r"create it first"):
        read_output_arrow(missing)
    with pytest.raises(ObjectStoreError, match=r"bucket 'no-such-bucket-snapcut' does not exist"):
        snapshots.open(missing)
    schema = pa.schema([("user", pa.int64()), ("n", pa.int64())])
    spec = RootSpec(
        uri="no-such-bucket-snapcut/state",
        vertex="state",
        partitions=2,
        key=("user",),
        state_key="user",
        state_schema=schema_bytes(schema),
        full_every=2,
        retain=3,
        filesystem=s3.filesystem(),
    )
    with pytest.raises(ObjectStoreError, match=r"state root .* bucket 'no-such-bucket-snapcut'"):
        StateRoot(spec).init("aggregate")
    code, _, err = cli(capsys, "list", missing)
    assert code == 2 and "no-such-bucket-snapcut' does not exist" in err
    assert len(err.strip().splitlines()) == 1
    # Nothing listens on this port (a URI retries for ~6 s, as pyarrow does).
    port = closed_port()
    gone = f"s3://bucket/out?endpoint_override=127.0.0.1%3A{port}&scheme=http"
    reach = rf"cannot reach http://127\.0\.0\.1:{port} .*is the server running"
    with pytest.raises(ObjectStoreError, match=rf"sink root {re.escape(gone)} .*{reach}"):
        ArrowSnapshotSink(gone)
    once = pafs.S3FileSystem(
        endpoint_override=f"127.0.0.1:{port}",
        scheme="http",
        access_key="k",
        secret_key="s",
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    )
    with pytest.raises(ObjectStoreError, match=reach):
        snapshots.open("bucket/out", filesystem=once)
    with pytest.raises(ObjectStoreError, match=reach):
        read_state_arrow("bucket/state", filesystem=once)
    assert issubclass(ObjectStoreError, StorageError)


def test_credentials_in_a_uri_stay_out_of_messages() -> None:
    assert redact("s3://KEY:SECRET@bucket/x?scheme=http") == "s3://***@bucket/x?scheme=http"
    assert redact("/local/path") == "/local/path"
    assert redact("s3://bucket/x@y") == "s3://bucket/x@y"
