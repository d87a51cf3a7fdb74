"""The chaos harnesses behind ``snapcut chaos``: they kill a reference job
(:mod:`snapcut.jobs`) at random moments and named crash points, restart it,
and compare the committed output with a failure-free run.
:mod:`~snapcut.chaos.local` drives the local runtime, :mod:`~snapcut.chaos.spark`
a Spark query; :mod:`~snapcut.chaos.core` is what both share."""
