"""The chaos harnesses behind ``snapcut chaos``: they kill a reference job
(:mod:`snapcut.jobs`) at random moments and named crash points, restart it,
and compare the committed output with a failure-free run.
:mod:`~snapcut.chaos.local` drives the local runtime's dwell-time job,
:mod:`~snapcut.chaos.fan_out` its fan-out job (a sink task failing, and with
``--process-kills`` the process killed), :mod:`~snapcut.chaos.spark` a Spark
query, :mod:`~snapcut.chaos.spark_chain` two chained Spark queries (the
second streaming the first's sink root); :mod:`~snapcut.chaos.core` is
what they share: the run loop, its one policy for which errors fail a run
and which stop the harness, the summary."""
