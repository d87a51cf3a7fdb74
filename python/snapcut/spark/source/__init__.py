"""snapcut roots the way Spark users reach data: ``spark.read.format("snapcut")``
on a state root (a version, ``batchId`` time travel, the change feed) or a
sink root (its committed output), and ``spark.readStream.format("snapcut")``
on a sink root (its committed batches, each once). :func:`register` makes the
format known to a session (classic or Connect); ``keyed_state``, the sink and
the ``read_*`` functions call it themselves. Importing this package imports
pyspark; ``snapcut.spark`` imports it lazily.
"""

from snapcut.spark.source.register import register

__all__ = ["register"]
