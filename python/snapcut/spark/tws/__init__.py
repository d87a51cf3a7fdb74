"""``transformWithState`` on snapcut: Spark's ``StatefulProcessor`` API with
each state variable (and the timers) a keyed table of its own in Rust.

- :mod:`.entry` — the entry: Spark's arguments checked, the state variables
  declared by Spark's pre-init, the step planned for ``keyed_state``;
- :mod:`.variables` — the state variables a processor declares, and the
  table each one is stored in;
- :mod:`.state` — one partition's state for one micro-batch, read ahead in
  bulk from the tables and written back in bulk;
- :mod:`.handle` — Spark's ``ValueState``/``ListState``/``MapState`` and the
  handle, over that state;
- :mod:`.processor` — the per-key driver with Spark's order of calls
  (initial state, input rows, expired timers, close), TTL and late rows.
"""
