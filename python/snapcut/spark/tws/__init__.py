"""``transformWithState`` on snapcut: Spark's ``StatefulProcessor`` API with
each state variable (and the timers) a keyed table of its own in Rust.

- :mod:`.variables` — the state variables a processor declares, and the
  table each one is stored in;
- :mod:`.state` — one partition's state for one micro-batch: Spark's
  ``ValueState``/``ListState``/``MapState`` and the handle, read ahead in bulk
  from the tables and written back in bulk;
- :mod:`.processor` — the per-key driver with Spark's order of calls
  (initial state, input rows, expired timers, close), TTL and late rows.
"""
