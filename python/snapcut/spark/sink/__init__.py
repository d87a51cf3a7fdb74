"""The sink room: ``ArrowSnapshotSink``, the exactly-once ``foreachBatch``
sink, and its root.

- :mod:`.staging` — executors write a batch's rows under ``_staging/``;
- :mod:`.arrow_sink` — the sink: checks, the batch's one Spark action, the
  wait for the state root's version N; what it did per batch is a
  :class:`~.report.BatchReport`;
- :mod:`.commit` — a batch's commit into the root: files moved into
  ``chk-<N>``, the manifest, the atomic rename; the removal of what no
  commit names;
- :mod:`.table_batch` — one batch's walk through a table output: checks,
  the replay test, the one table commit, the manifest's record;
- :mod:`.table` — what the table outputs share: the ``TableOutput`` base
  the sink's per-batch table walk talks to, Parquet data files, the
  ``snapcut.app_id``/``snapcut.batch`` commit properties;
- :mod:`.delta` — the Delta Lake output (``output=DeltaOutput(uri)``): the
  table's checks, Parquet data files, one app-transaction commit per batch;
- :mod:`.iceberg` — the Apache Iceberg output (``output=IcebergOutput(
  catalog_properties, "ns.table")``): one snapshot per batch whose summary
  carries the app id and batch;
- :mod:`.root` — :class:`~.root.SinkRoot`: the root's description, its
  committed batches and the pyarrow readers of the committed output.

Reading the output into Spark is :mod:`snapcut.spark.source`'s.
"""
