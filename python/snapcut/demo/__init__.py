"""The demos behind ``snapcut demo``: the dwell-time job on Spark, killed and
restarted midway (:mod:`~snapcut.demo.spark`), and on the local runtime
(:mod:`~snapcut.demo.local`)."""
