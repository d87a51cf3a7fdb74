"""snapcut roots the way Spark users reach data: ``spark.read.format("snapcut")``
on a state root (a version, ``batchId`` time travel, the change feed) or a
sink root (its committed output), and ``spark.readStream.format("snapcut")``
on a sink root (its committed batches, each once). :func:`register` makes the
format known to a session (classic or Connect); ``keyed_state``, the sink and
the ``read_*`` functions call it themselves.

- :mod:`.options` — the options, parsed and checked once;
- :mod:`.state_plan` — a state root's version or change feed, planned;
- :mod:`.output_plan` — a sink root's committed output, planned;
- :mod:`.stream` — a sink root as a streaming source;
- :mod:`.data_source` — Spark's ``DataSource`` over those plans (imports pyspark);
- :mod:`.register` — ``register(spark)``; :mod:`.functions` — ``read_state``
  and ``read_output``, the function forms.
"""
