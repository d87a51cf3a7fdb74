"""The state room: a keyed_state step's state root and everything that
reads or writes it.

- :mod:`.spec` — what a root holds (partitions, key, schema, the tables of a
  transformWithState operator) and where each table lives;
- :mod:`.root` — :class:`~.root.StateRoot`, one object per query: the
  root's files (per-batch state files, acknowledgements, manifests), its
  creation and checks (:mod:`.setup`, :mod:`.evolution`), and the sink's
  wait for a committed version (``await_committed``);
- :mod:`.partition` — one state partition's work in one micro-batch, and
  :mod:`.task` — the executor-side task function around it;
- :mod:`.worker_memory` — a worker's ``state_memory`` and its split;
  :mod:`.warm` — the partitions it keeps warm;
- :mod:`.initial` — ``initial_state=``; :mod:`.read` — reading a root back;
  :mod:`.rescale` — copying a root to another number of partitions.
"""
