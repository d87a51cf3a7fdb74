"""The sink's Delta Lake output (``ArrowSnapshotSink(..., output=DeltaOutput(uri))``):
the table's checks, the executors' Parquet data files and the driver's one
Delta commit per batch, with delta-rs (``deltalake``, imported lazily: snapcut
works without it).

- append / complete: each task writes its rows as Parquet files into the
  table's directory (``snapcut-b<N>-<query>/part-<p>-<k>-a<attempt>-<token>.parquet``,
  unreferenced until committed); the driver adds the winning attempts' files
  in one commit (``create_write_transaction``, ``"append"`` or
  ``"overwrite"``; the first batch creates the table with them).
- update: delta-rs' MERGE cannot take files written elsewhere (it rewrites
  the target's files itself), so the driver takes the batch's rows with
  ``toArrow()`` and merges them (the newest row per key) with
  ``DeltaTable.merge``: the batch's rows pass through the driver.

Every commit carries the app transaction ``(app_id, batch id)`` and
``snapcut.app_id`` / ``snapcut.batch`` in its commit info: a batch whose commit
is in the table (a crash after the table commit, before snapcut's manifest) is
found there and not committed twice (delta-rs does not skip a replayed
version by itself: delta-rs #2580/#3821).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs

from snapcut import _fs
from snapcut._core import ConfigError, SnapshotError
from snapcut.spark.sink import credentials
from snapcut.spark.sink.root import newest_per_key
from snapcut.spark.sink.table import (
    APP_ID_KEY,
    BATCH_DIR,
    BATCH_KEY,
    BatchCommit,
    TableFiles,
    TableOutput,
    batch_dir,
    check_schema_mode,
    encode_parquet,
    new_columns,
    refuse_owner_or_schema,
    utc_timestamps,
)
from snapcut.spark.sink.table import table_errors as _errors

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["DeltaOutput", "encode_parquet"]

INSTALL = "pip install 'snapcut[delta]'"


def _deltalake() -> Any:
    try:
        import deltalake
    except ImportError as e:
        raise ConfigError(
            f"output=DeltaOutput(...) needs the deltalake package (delta-rs): {INSTALL}"
        ) from e
    return deltalake


def delta_schema(schema: pa.Schema) -> pa.Schema:
    """The output schema in Delta's types, as the table stores and readers
    return it: timestamps become µs in UTC (Delta ``timestamp``) or without
    a zone (``timestamp_ntz``). A type Delta cannot hold is a ConfigError."""
    deltalake = _deltalake()
    try:
        delta = deltalake.Schema.from_arrow(utc_timestamps(schema))
    except Exception as e:  # delta-rs raises a bare Exception for unsupported types
        raise ConfigError(
            f"the batch's columns cannot be a Delta table ({e}): select/cast them to types "
            "Delta Lake has (no unsigned integers, no time-of-day)"
        ) from e
    return pa.schema(delta.to_arrow())


class DeltaOutput(TableOutput):
    """A Delta Lake table as the sink's output: ``uri`` a local path or an
    object-store URI delta-rs opens (``s3://bucket/t``); ``storage_options``
    delta-rs' (``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``, credentials, ...);
    ``filesystem`` the pyarrow filesystem the executors write data files
    with (default: resolved from ``uri``; pass one for a store whose URI
    alone does not say how to reach it); ``schema_mode="merge"``: columns
    the output adds (a restarted query's new column) are added to the
    table, nullable (without it such a batch is refused). Picklable."""

    def __init__(
        self,
        uri: str | os.PathLike[str],
        storage_options: dict[str, str] | None = None,
        filesystem: Any = None,
        *,
        schema_mode: str | None = None,
    ) -> None:
        _deltalake()
        self.schema_mode = check_schema_mode(schema_mode, "DeltaOutput")
        self.uri = os.fspath(uri)
        self.storage_options = dict(storage_options or {})
        self.name = _fs.redact(self.uri)
        inner = (
            self.uri.split("://", 1)[1]
            if filesystem is not None and "://" in self.uri
            else self.uri
        )
        self.fs, self.path = _fs.resolve(inner, filesystem)
        self._checked: str | None = None
        self._probed = False

    format = "delta"

    def table_schema(self, schema: pa.Schema) -> pa.Schema:
        return delta_schema(schema)

    def describe(self) -> dict[str, Any]:
        """What the sink root's description records of the output."""
        return {"format": "delta", "table": self.name}

    def table(self) -> DeltaTable | None:
        """The table, or None if there is none yet; a path that holds other
        files is refused (not a Delta table)."""
        deltalake = _deltalake()
        opts = self.storage_options or None
        files = credentials.filesystem_client(self.fs)
        with _errors(self.name, "opening the table"):
            # Not DeltaTable.is_deltatable: its list request times out against
            # moto's S3 server (delta-rs 1.6.6) where opening the table works.
            with credentials.checked(self.name, files):
                log = self.fs.get_file_info(
                    pafs.FileSelector(f"{self.path}/_delta_log", allow_not_found=True)
                )
            if any(i.base_name.endswith(".json") or ".checkpoint." in i.base_name for i in log):
                with credentials.checked(self.name, self._delta_client()):
                    table: DeltaTable = deltalake.DeltaTable(self.uri, storage_options=opts)
                self._probed = True
                return table
            info = [
                i
                for i in self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
                if not _uncommitted(i)
            ]
        if info:
            shown = ", ".join(sorted(i.base_name for i in info)[:5])
            raise ConfigError(
                f"output table {self.name} is not a Delta table: the path holds other files "
                f"({shown}) and no _delta_log/. Pass an empty or new path, or an existing "
                "Delta table (nothing was written)"
            )
        self._probe_delta()
        return None

    def read(self, version: int | None = None) -> pa.Table:
        """The table's rows at `version` (default: its newest), read with the
        output's own pyarrow filesystem. Not ``DeltaTable.to_pyarrow_table()``:
        its default filesystem is a Python handler that Arrow's I/O threads
        call back into, and a process that used it aborts at exit about half
        the time (``terminate called without an active exception``, SIGABRT)."""
        deltalake = _deltalake()
        opts = self.storage_options or None
        with _errors(self.name, "reading the table"):
            dt = deltalake.DeltaTable(self.uri, version=version, storage_options=opts)
            files = pafs.SubTreeFileSystem(self.path, self.fs)
            table: pa.Table = dt.to_pyarrow_dataset(filesystem=files).to_table()
            return table

    def _delta_client(self) -> credentials.S3Client | None:
        """delta-rs' credentials, where the table is on S3."""
        return credentials.delta_client(self.storage_options) if self._on_s3() else None

    def _on_s3(self) -> bool:
        return self.uri.split("://", 1)[0].lower() in ("s3", "s3a")

    def _probe_delta(self) -> None:
        """A new table on S3: delta-rs' first request would be the commit,
        after the executors wrote the batch's files; its credentials are
        tried now, once, by opening the (missing) table."""
        if self._probed or not self._on_s3():
            return
        from deltalake.exceptions import TableNotFoundError

        opts = self.storage_options or None
        client = self._delta_client()
        with (
            _errors(self.name, "opening the table"),
            credentials.checked(self.name, client),
            contextlib.suppress(TableNotFoundError),
        ):
            _deltalake().DeltaTable(self.uri, storage_options=opts)
        self._probed = True

    def check(self, dt: DeltaTable | None, app_id: str, schema: pa.Schema) -> None:
        """Refuses, before the batch writes anything, a table another snapcut
        sink writes (another app id) or whose schema is not the output's."""
        if dt is None or self._checked == app_id:
            return
        with _errors(self.name, "reading the history"):
            history = list(self._history(dt))
            have = pa.schema(dt.schema().to_arrow())
        owners = {str(h[APP_ID_KEY]) for h in history if h.get(APP_ID_KEY) is not None}
        refuse_owner_or_schema(self, owners, app_id, have, schema)
        self._checked = app_id

    def committed_version(
        self, dt: DeltaTable | None, app_id: str, batch: int, limit: int | None = None
    ) -> dict[str, Any] | None:
        """The commit info (``version``, ``snapcut.*``) of the table commit
        of `batch` of `app_id`, if there is one (among the newest `limit`)."""
        if dt is None:
            return None
        with _errors(self.name, "reading the app transaction"):
            done = dt.transaction_version(app_id)
            if done is None or done < batch:
                return None
            for h in self._history(dt, limit):
                if h.get(APP_ID_KEY) == app_id and h.get(BATCH_KEY) == batch:
                    return h
        raise SnapshotError(
            f"output table {self.name} has app id {app_id}'s batch {done} committed but no "
            f"commit of batch {batch} in its history (was the history cleaned, or the table "
            "restored?): write to a new table and sink root"
        )

    def _history(self, dt: DeltaTable, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """The commit infos (with ``version``), newest first, read from the
        log's JSON commits with the pyarrow filesystem. Not
        ``DeltaTable.history()``: its list request times out against moto's
        S3 server (delta-rs 1.6.6) where opening the table works. Commits
        whose JSON the log cleanup removed are skipped."""
        newest = dt.version()
        oldest = 0 if limit is None else max(0, newest - limit + 1)
        for version in range(newest, oldest - 1, -1):
            path = f"{self.path}/_delta_log/{version:020d}.json"
            try:
                text = _fs.read_bytes(self.fs, path).decode()
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                action = json.loads(line) if line.strip() else {}
                if "commitInfo" in action:
                    yield {**action["commitInfo"], "version": version}
                    break

    def files(self, table: Any, query_id: str, batch: int, schema: pa.Schema) -> TableFiles:
        return TableFiles(self.fs, self.path, batch_dir(query_id, batch))

    def record(self, info: dict[str, Any]) -> dict[str, Any]:
        return {"table": self.name, "version": int(info["version"])}

    def commit(self, dt: DeltaTable | None, commit: BatchCommit) -> dict[str, Any]:
        """One Delta commit carrying the app transaction ``(app_id, batch)``
        and the commit's properties in its commit info; returns the info."""
        deltalake = _deltalake()
        from deltalake import CommitProperties, Transaction

        props = CommitProperties(
            custom_metadata=commit.properties(),
            app_transactions=[Transaction(commit.app_id, commit.batch)],
        )
        opts = self.storage_options or None
        with _errors(self.name, f"the commit of batch {commit.batch}"):
            self._commit(dt, commit, props)
            if dt is None:  # the commit created the table
                dt = deltalake.DeltaTable(self.uri, storage_options=opts)
            else:
                # Brought up to the log's newest version (MERGE moved it
                # already; a write transaction does not): the commit just
                # made is among the versions read, without re-opening the
                # table from its log.
                dt.update_incremental()
            done = self.committed_version(dt, commit.app_id, commit.batch, limit=16)
        assert done is not None, "the commit just made is in the table"
        return done

    def _widens(self, dt: DeltaTable | None, commit: BatchCommit) -> bool:
        """Whether the batch adds columns to the table (``schema_mode="merge"``;
        check() refused them otherwise)."""
        if dt is None or not new_columns(pa.schema(dt.schema().to_arrow()), commit.schema):
            return False
        assert self.schema_mode == "merge", "check() refuses new columns without the opt-in"
        return True

    def _commit(self, dt: DeltaTable | None, commit: BatchCommit, props: Any) -> None:
        """The batch's one commit. A batch that adds columns widens the
        schema in that same commit: MERGE with ``merge_schema``, or
        ``write_deltalake(schema_mode="merge")`` for an empty update batch,
        an append or a complete batch (delta-rs' create_write_transaction
        keeps the table's schema, so the executors' files of such a batch
        are read back and written again; they are then removed)."""
        deltalake = _deltalake()
        from deltalake.transaction import (
            AddAction,
            RemoveAction,
            create_table_with_add_actions,
        )

        opts = self.storage_options or None
        mode, key, schema = commit.mode, commit.key, commit.schema
        files, rows = commit.files, commit.rows
        widens = self._widens(dt, commit)
        if mode == "update":
            assert rows is not None
            source = newest_per_key(rows, key).cast(schema)
            if dt is None:
                deltalake.write_deltalake(
                    self.uri, source, mode="error", storage_options=opts, commit_properties=props
                )
            elif source.num_rows == 0:
                # MERGE of no rows makes no commit (delta-rs 1.6.6): an empty
                # append carries the batch's app transaction instead.
                if widens:
                    deltalake.write_deltalake(
                        dt, source, mode="append", schema_mode="merge", commit_properties=props
                    )
                else:
                    empty: list[AddAction | RemoveAction] = []
                    dt.create_write_transaction(empty, "append", schema, commit_properties=props)
            else:
                on = " AND ".join(f't."{k}" IS NOT DISTINCT FROM s."{k}"' for k in key)
                dt.merge(
                    source,
                    on,
                    source_alias="s",
                    target_alias="t",
                    merge_schema=widens,
                    commit_properties=props,
                ).when_matched_update_all().when_not_matched_insert_all().execute()
            return
        how = "overwrite" if mode == "complete" else "append"
        if widens:
            assert dt is not None
            written = self._read_files(files, schema)
            deltalake.write_deltalake(
                dt, written, mode=how, schema_mode="merge", commit_properties=props
            )
            self._remove_files(files)
            return
        now = int(time.time() * 1000)
        adds = [AddAction(f["path"], f["bytes"], {}, now, True, f["stats"]) for f in files]
        if dt is None:
            create_table_with_add_actions(
                self.uri,
                deltalake.Schema.from_arrow(schema),
                adds,
                mode="error",
                storage_options=opts,
                commit_properties=props,
            )
        else:
            actions: list[AddAction | RemoveAction] = list(adds)
            dt.create_write_transaction(actions, how, schema, commit_properties=props)

    def _read_files(self, files: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
        """The executors' Parquet files of the batch (paths relative to the table)."""
        import pyarrow.parquet as pq

        parts = [
            pq.read_table(f"{self.path}/{f['path']}", filesystem=self.fs).cast(schema)
            for f in files
        ]
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def _remove_files(self, files: list[dict[str, Any]]) -> None:
        """Best effort: the executors' files of a batch that was written
        again (no commit names them; VACUUM would remove them too)."""
        for f in files:
            with contextlib.suppress(OSError):
                self.fs.delete_file(f"{self.path}/{f['path']}")


def _uncommitted(info: pafs.FileInfo) -> bool:
    """What a sink killed before its first Delta commit leaves at the path:
    batch directories of data files no commit references (replaced when the
    batch runs again), and a `_delta_log/` with no commit in it. Not other
    files: those are refused."""
    if info.type != pafs.FileType.Directory:
        return False
    return info.base_name == "_delta_log" or BATCH_DIR.fullmatch(info.base_name) is not None
