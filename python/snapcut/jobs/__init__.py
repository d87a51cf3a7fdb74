"""The reference jobs the demo and the chaos harnesses start as child
processes (``python -m snapcut.jobs.<name>``) and kill: the dwell-time job on
the local runtime (:mod:`~snapcut.jobs.local_dwell`) and on Spark
(:mod:`~snapcut.jobs.spark_dwell`), and two chained Spark queries
(:mod:`~snapcut.jobs.spark_chain`)."""
