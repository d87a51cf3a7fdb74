"""The sink's Apache Iceberg output (``ArrowSnapshotSink(...,
output=IcebergOutput(catalog_properties, "ns.table"))``): the table's checks,
the executors' Parquet data files and the driver's one Iceberg snapshot per
batch, with pyiceberg (imported lazily: snapcut works without it).

- the catalog: pyiceberg's ``load_catalog(name, **catalog_properties)``, e.g.
  a local ``SqlCatalog`` on SQLite (``{"type": "sql", "uri":
  "sqlite:////data/catalog.db", "warehouse": "file:///data/warehouse"}``) or
  one whose warehouse is on S3 (``"s3.endpoint"``, ``"s3.access-key-id"``,
  ...); the first batch creates the namespace and the table (its first
  snapshot in the same catalog commit);
- append / complete: each task writes its rows as Parquet files into the
  table's ``data/`` directory (``snapcut-b<N>-<query>/part-<p>-<k>-a<attempt>
  -<token>.parquet``, unreferenced until committed); the driver adds the
  winning attempts' files in one snapshot (a fast append; complete mode: an
  overwrite that also removes every data file of the current snapshot);
- update: the driver takes the batch's rows with ``toArrow()`` and merges
  them (the newest row per key)
  copy-on-write: the data files that may hold a key of the batch (pruned by
  their column statistics against the batch's keys, or against their range
  beyond ``IN_LITERALS`` keys) are read, merged with the batch's rows and
  replaced by one new file, in one overwrite snapshot. The batch's rows and
  those files pass through the driver. (Not ``Table.upsert`` nor an
  ``overwrite`` with a filter: they make two or three snapshots, deletes and
  appends, where a batch is one; and upsert filters by one literal per key.)

Every snapshot's summary carries ``snapcut.app_id`` and ``snapcut.batch``
(Flink's committer keeps ``flink.max-committed-checkpoint-id`` the same
way): a batch whose snapshot is in the current snapshot's ancestry (a crash
after the catalog commit, before snapcut's manifest) is found there and not
committed twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from snapcut import _fs
from snapcut._core import ConfigError, SnapshotError, StorageError
from snapcut.spark.sink import credentials
from snapcut.spark.sink.root import newest_by_group, newest_per_key
from snapcut.spark.sink.table import (
    APP_ID_KEY,
    BATCH_KEY,
    BatchCommit,
    TableFiles,
    TableOutput,
    batch_dir,
    check_schema_mode,
    encode_parquet,
    new_columns,
    refuse_owner_or_schema,
    table_errors,
    utc_timestamps,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

__all__ = ["IcebergOutput"]

INSTALL = "pip install 'snapcut[iceberg]'"


def _pyiceberg() -> Any:
    try:
        import pyiceberg.catalog
        import pyiceberg.io.pyarrow
    except ImportError as e:
        raise ConfigError(
            f"output=IcebergOutput(...) needs the pyiceberg package: {INSTALL}"
        ) from e
    return pyiceberg


class IcebergOutput(TableOutput):
    """An Apache Iceberg table as the sink's output: ``catalog_properties``
    pyiceberg's (``load_catalog(catalog_name, **catalog_properties)``);
    ``identifier`` the table, ``"namespace.table"``; ``filesystem`` the
    pyarrow filesystem the executors write data files with (default: the one
    pyiceberg's FileIO opens for the table's location from the catalog
    properties); ``schema_mode="merge"``: columns the output adds (a
    restarted query's new column) are added to the table, optional, in the
    batch's own catalog commit (pyiceberg's ``union_by_name``; without it
    such a batch is refused). Picklable (the catalog is opened where it is
    used)."""

    format = "iceberg"

    def __init__(
        self,
        catalog_properties: dict[str, str],
        identifier: str,
        *,
        catalog_name: str = "snapcut",
        filesystem: Any = None,
        schema_mode: str | None = None,
    ) -> None:
        _pyiceberg()
        self.schema_mode = check_schema_mode(schema_mode, "IcebergOutput")
        parts = identifier.split(".") if isinstance(identifier, str) else []
        if len(parts) < 2 or not all(parts):
            raise ConfigError(
                f"IcebergOutput's identifier must be 'namespace.table', got {identifier!r}"
            )
        if not isinstance(catalog_properties, dict) or not catalog_properties:
            raise ConfigError(
                "IcebergOutput needs catalog_properties, pyiceberg's load_catalog properties: "
                "e.g. {'type': 'sql', 'uri': 'sqlite:////data/catalog.db', 'warehouse': "
                f"'file:///data/warehouse'}}, got {catalog_properties!r}"
            )
        self.catalog_properties = {str(k): str(v) for k, v in catalog_properties.items()}
        self.identifier = identifier
        self.namespace = tuple(parts[:-1])
        self.catalog_name = catalog_name
        self.filesystem = filesystem
        self.name = identifier
        self.catalog_uri = _fs.redact(self.catalog_properties.get("uri", catalog_name))
        self._catalog: Catalog | None = None
        self._checked: str | None = None
        self._probed: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_catalog": None}

    def describe(self) -> dict[str, Any]:
        return {"format": "iceberg", "table": self.identifier, "catalog": self.catalog_uri}

    def record(self, info: dict[str, Any]) -> dict[str, Any]:
        return {
            "table": self.identifier,
            "catalog": self.catalog_uri,
            "snapshot_id": int(info["snapshot_id"]),
            "sequence_number": int(info["sequence_number"]),
        }

    # -- the catalog and the table ----------------------------------------------

    def catalog(self) -> Catalog:
        """The catalog (opened once per process); a catalog pyiceberg cannot
        load is a ConfigError, one it cannot reach a StorageError."""
        if self._catalog is None:
            pyiceberg = _pyiceberg()
            try:
                self._catalog = pyiceberg.catalog.load_catalog(
                    self.catalog_name, **self.catalog_properties
                )
            except (ValueError, NotImplementedError, ImportError) as e:
                raise ConfigError(
                    f"IcebergOutput's catalog cannot be loaded from its catalog_properties "
                    f"({e}): pass pyiceberg's load_catalog properties, e.g. {{'type': 'sql', "
                    "'uri': 'sqlite:////data/catalog.db', 'warehouse': 'file:///data/warehouse'}"
                ) from e
            except Exception as e:
                raise StorageError(
                    f"IcebergOutput's catalog {self.catalog_uri} cannot be reached ({e}): check "
                    "its uri, that the catalog's directory or server exists, and the "
                    "credentials (nothing was written)"
                ) from e
        return self._catalog

    def table_schema(self, schema: pa.Schema) -> pa.Schema:
        """The output schema in Iceberg's types as readers get them back
        (timestamps in µs, UTC when zoned). A type Iceberg cannot hold is a
        ConfigError."""
        pyiceberg = _pyiceberg()
        try:
            iceberg = pyiceberg.catalog.Catalog._convert_schema_if_needed(utc_timestamps(schema))
        except Exception as e:  # pyiceberg raises TypeError/ValueError/NotImplementedError
            raise ConfigError(
                f"the batch's columns cannot be an Iceberg table ({e}): select/cast them to "
                "types Iceberg has"
            ) from e
        have: pa.Schema = pyiceberg.io.pyarrow.schema_to_pyarrow(iceberg, include_field_ids=False)
        return have

    def table(self) -> Table | None:
        """The table, or None if there is none yet; an identifier that names
        a namespace or a view is refused (not a table)."""
        from pyiceberg.exceptions import NoSuchTableError

        catalog = self.catalog()
        warehouse = self.catalog_properties.get("warehouse", "")
        io = credentials.catalog_client(self.catalog_properties) if _on_s3(warehouse) else None
        with table_errors(self.name, "loading the table from the catalog"):
            try:
                # Reads the table's metadata file with the catalog's FileIO.
                with credentials.checked(self.name, io):
                    table: Table = catalog.load_table(self.identifier)
                return table
            except NoSuchTableError:
                pass
            what = "a namespace" if catalog.namespace_exists(self.identifier) else None
            if what is None and _view_exists(catalog, self.identifier):
                what = "a view"
        if what is not None:
            raise ConfigError(
                f"output table {self.name} is not an Iceberg table: the catalog has {what} of "
                "that name. Pass the identifier of an existing table or of a new one "
                "('namespace.table'; nothing was written)"
            )
        return None

    def check(self, table: Table | None, app_id: str, schema: pa.Schema) -> None:
        """Refuses, before the batch writes anything, a table another snapcut
        sink writes (another app id on the table or in a snapshot's summary)
        or whose schema is not the output's."""
        if table is None or self._checked == app_id:
            return
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        with table_errors(self.name, "reading the snapshots"):
            owners = {table.properties.get(APP_ID_KEY)}
            owners |= {_summary(s).get(APP_ID_KEY) for s in table.snapshots()}
            have = schema_to_pyarrow(table.schema(), include_field_ids=False)
        found = {str(o) for o in owners if o is not None}
        refuse_owner_or_schema(self, found, app_id, have, schema)
        self._checked = app_id

    def committed_version(
        self, table: Table | None, app_id: str, batch: int
    ) -> dict[str, Any] | None:
        """The snapshot of `batch` of `app_id` (``version``/``snapshot_id``,
        ``sequence_number``, the ``snapcut.*`` summary), if the current
        snapshot's ancestry has it. Batches commit in order: the walk stops
        at the app's first older batch."""
        if table is None:
            return None
        from pyiceberg.table.snapshots import ancestors_of

        newer: int | None = None
        with table_errors(self.name, "reading the snapshot ancestry"):
            for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
                summary = _summary(snapshot)
                if summary.get(APP_ID_KEY) != app_id:
                    continue
                done = int(summary[BATCH_KEY])
                if done == batch:
                    return {
                        **summary,
                        "version": snapshot.snapshot_id,
                        "snapshot_id": snapshot.snapshot_id,
                        "sequence_number": snapshot.sequence_number,
                    }
                if done < batch:
                    break
                newer = done
        if newer is None:
            return None
        raise SnapshotError(
            f"output table {self.name} has app id {app_id}'s batch {newer} committed but no "
            f"snapshot of batch {batch} in the current snapshot's ancestry (were snapshots "
            "expired, or the table rolled back?): write to a new table and sink root"
        )

    def files(
        self, table: Table | None, query_id: str, batch: int, schema: pa.Schema
    ) -> TableFiles:
        """The batch's directory under the table's ``data/`` (the location
        the catalog gives a new table, for the first batch)."""
        with table_errors(self.name, "resolving the table's location"):
            location = table.location() if table is not None else self._new_location(schema)
            fs, path = self._filesystem(location)
        files = TableFiles(fs, f"{path}/data", batch_dir(query_id, batch))
        self._probe(location, files)
        return files

    def _probe(self, location: str, files: TableFiles) -> None:
        """On S3, once: each client's credentials are tried with a read
        before the executors write (their first request would be a task's
        write, the catalog's FileIO's the commit's metadata file)."""
        if self._probed == location or not _on_s3(location):
            return
        from pyiceberg.io import load_file_io

        io_client = credentials.catalog_client(self.catalog_properties)
        data_client: credentials.S3Client | None = io_client
        if self.filesystem is not None:
            data_client = credentials.filesystem_client(files.fs)
        where = f"{files.table_path}/{files.batch_dir}"
        with table_errors(self.name, "trying the store's credentials"):
            with credentials.checked(self.name, data_client):
                files.fs.get_file_info(pafs.FileSelector(where, allow_not_found=True))
            if self.filesystem is not None:  # the FileIO is another client
                io = load_file_io(self.catalog_properties, location)
                with credentials.checked(self.name, io_client):
                    io.new_input(f"{location}/metadata/snapcut-credentials-probe").exists()
        self._probed = location

    def _new_location(self, schema: pa.Schema) -> str:
        """Where the catalog puts the table it creates: the namespace is
        created (the default location is the namespace's), the table not."""
        catalog = self.catalog()
        catalog.create_namespace_if_not_exists(self.namespace)
        created = catalog.create_table_transaction(self.identifier, schema)
        location: str = created.table_metadata.location
        return location.rstrip("/")

    def _filesystem(self, location: str) -> tuple[Any, str]:
        from pyiceberg.io import load_file_io
        from pyiceberg.io.pyarrow import PyArrowFileIO

        scheme, netloc, path = PyArrowFileIO.parse_location(location)
        if self.filesystem is not None:
            return self.filesystem, path.rstrip("/")
        io = load_file_io(self.catalog_properties, location)
        if isinstance(io, PyArrowFileIO):
            return io.fs_by_scheme(scheme, netloc), path.rstrip("/")
        return _fs.resolve(location)

    # -- the commit ------------------------------------------------------------------

    def commit(self, table: Table | None, commit: BatchCommit) -> dict[str, Any]:
        """One catalog commit of one snapshot whose summary carries the
        commit's properties (app id, batch, counts); the first batch's commit
        creates the table (with its owner's app id as a table property)."""
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        props = {k: str(v) for k, v in commit.properties().items()}
        mode, app_id, batch = commit.mode, commit.app_id, commit.batch
        catalog = self.catalog()
        with table_errors(self.name, f"the commit of batch {batch}"):
            txn: Any
            if table is None:
                catalog.create_namespace_if_not_exists(self.namespace)
                txn = catalog.create_table_transaction(
                    self.identifier, commit.schema, properties={APP_ID_KEY: app_id}
                )
            else:
                txn = table.transaction()
            if table is not None:
                self._add_columns(txn, commit.schema)
            if txn.table_metadata.name_mapping() is None:
                # The tasks' Parquet files have no field ids: readers map
                # their columns by name (as pyiceberg's add_files sets it;
                # its schema update maps the columns it adds).
                mapping = txn.table_metadata.schema().name_mapping.model_dump_json()
                txn.set_properties(**{"schema.name-mapping.default": mapping})
            location = txn.table_metadata.location.rstrip("/")
            paths = [f"{location}/data/{f['path']}" for f in commit.files]
            removed: list[Any] = []
            if table is not None and mode == "complete":
                removed = [task.file for task in table.scan().plan_files()]
            elif mode == "update":
                assert commit.rows is not None
                removed, merged = self._merge(table, commit.key, commit.schema, commit.rows)
                paths = (
                    [] if merged.num_rows == 0 else [self._write(location, commit.where, merged)]
                )
            io = txn._table.io
            added = [parquet_file_to_data_file(io, txn.table_metadata, p) for p in paths]
            update = txn.update_snapshot(snapshot_properties=props)
            producer: Any = (
                update.fast_append() if table is None or mode == "append" else update.overwrite()
            )
            with producer as snapshot:
                for data_file in removed:
                    snapshot.delete_data_file(data_file)
                for data_file in added:
                    snapshot.append_data_file(data_file)
            txn.commit_transaction()
            done = self.committed_version(catalog.load_table(self.identifier), app_id, batch)
        assert done is not None, "the commit just made is in the table"
        return done

    def _add_columns(self, txn: Any, schema: pa.Schema) -> None:
        """The columns the output adds (``schema_mode="merge"``; check()
        refused them otherwise), added in the batch's transaction."""
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        have = schema_to_pyarrow(txn.table_metadata.schema(), include_field_ids=False)
        added = new_columns(have, schema)
        if added:
            assert self.schema_mode == "merge", "check() refuses new columns without the opt-in"
            with txn.update_schema() as update:
                update.union_by_name(pa.schema(added))

    def _merge(
        self, table: Table | None, key: Sequence[str], schema: pa.Schema, rows: pa.Table
    ) -> tuple[list[Any], pa.Table]:
        """Update mode: the data files that may hold a key of the batch, and
        their rows merged with the batch's (the newest row per key)."""
        source = newest_per_key(rows, key).cast(schema)
        if table is None or table.current_snapshot() is None or source.num_rows == 0:
            return [], source
        tasks = list(table.scan(row_filter=_key_filter(source, key)).plan_files())
        if any(task.delete_files for task in tasks):
            raise ConfigError(
                f"output table {self.name} has row-level delete files, which the sink's update "
                "mode does not merge: compact the table (rewrite its data files) or write to a "
                "new table (nothing was written)"
            )
        old = []
        for task in tasks:
            with table.io.new_input(task.file.file_path).open() as f:
                old.append(_conform(pq.read_table(f), schema))
        merged = newest_by_group(pa.concat_tables([*old, source]), key) if old else source
        return [task.file for task in tasks], merged

    def _write(self, location: str, where: TableFiles, rows: pa.Table) -> str:
        """Update mode: the merged rows as one Parquet file in the batch's
        directory (the driver's); returns its URI."""
        rel = f"{where.batch_dir}/update-{uuid.uuid4().hex[:12]}.parquet"
        data, _ = encode_parquet(rows)
        _fs.write_bytes(where.fs, f"{where.table_path}/{rel}", data)
        return f"{location}/data/{rel}"


def _conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """A data file's rows in the output's columns: a column added to the
    table after the file was written (``schema_mode="merge"``) is null."""
    columns = [
        rows[f.name] if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, names=schema.names).cast(schema)


def _on_s3(location: str) -> bool:
    return location.split("://", 1)[0].lower() in ("s3", "s3a", "s3n")


def _summary(snapshot: Any) -> dict[str, Any]:
    summary = snapshot.summary
    return {} if summary is None else dict(summary.additional_properties)


def _view_exists(catalog: Any, identifier: str) -> bool:
    try:
        return bool(catalog.view_exists(identifier))
    except NotImplementedError:  # SqlCatalog has no views
        return False


IN_LITERALS = 1000
"""Up to this many distinct values a key column's filter is ``In`` them,
beyond it their range: pyiceberg builds and binds one pydantic literal per
value (twice), ≈ 4.5 s for the 86k keys of a 100k-key batch, the whole of
that batch's commit but 0.5 s. A file ``In`` keeps, the range keeps too
(a file whose bounds fall between two keys is read and rewritten for
nothing, which costs less than the literals where keys are this many)."""


def _key_filter(source: pa.Table, key: Sequence[str]) -> Any:
    """A filter every row with a key of `source` passes (the batch's key
    values per column, or their range), for pruning data files by their
    statistics."""
    from pyiceberg import expressions

    ex: Any = expressions  # its pydantic models' constructors are not typed as called
    expr: Any = ex.AlwaysTrue()
    try:
        for k in key:
            column = source[k]
            distinct = pc.unique(column.drop_null())
            part: Any = None
            if len(distinct) > IN_LITERALS:
                low, high = (v.as_py() for v in pc.min_max(distinct).values())
                part = ex.And(ex.GreaterThanOrEqual(k, low), ex.LessThanOrEqual(k, high))
            elif len(distinct):
                part = ex.In(k, distinct.to_pylist())
            if column.null_count:
                part = ex.IsNull(k) if part is None else ex.Or(part, ex.IsNull(k))
            expr = part if isinstance(expr, ex.AlwaysTrue) else ex.And(expr, part)
    except Exception:  # a key type pyiceberg has no literal for: no pruning
        return ex.AlwaysTrue()
    return expr
