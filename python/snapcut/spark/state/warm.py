"""The partitions a Python worker keeps warm (:class:`StateCache`): their
tables, put back only once their version is durable, and flushed past the
worker's :func:`~snapcut.spark.state.worker_memory.warm_memory`.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

from snapcut._core import StateTable
from snapcut.spark.state.worker_memory import warm_memory

__all__ = [
    "CACHE",
    "Runs",
    "StateCache",
    "Tables",
]

Tables = dict[str, StateTable]
"""A partition's state tables by vertex (one, or one per state variable)."""
Runs = dict[str, list[dict[str, Any]]]
"""Each table's runs (format 2): the run entries its state file's entry
lists, newest first, down to a full."""


class StateCache:
    """This process's warm state: (root, vertex, partition) → (version, the
    runs each table was written as, the tables).

    A table is taken out while a task works on it and put back only when its
    version is durable, so a failed task never leaves a half-applied table.
    The runs are the ones its state file's entry lists (the task wrote both),
    so a warm task reads nothing of the previous version but its manifest.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._tables: OrderedDict[tuple[str, str, int], tuple[int, Runs, Tables]] = OrderedDict()

    def take(self, key: tuple[str, str, int], version: int) -> tuple[Tables, Runs] | None:
        """The tables at `version` and their runs, or None (taken out either way)."""
        with self._lock:
            hit = self._tables.pop(key, None)
        if hit is None or hit[0] != version:
            return None
        return hit[2], hit[1]

    def put(
        self,
        key: tuple[str, str, int],
        version: int,
        runs: Runs,
        tables: Tables,
        memory: int | None = None,
    ) -> None:
        """Keeps `tables` warm; with a worker budget `memory`, then flushes
        the largest in-memory rows of the warm tables that have a budget
        until they hold at most its warm share (a quarter: the rest is the
        working partition's and its held input's)."""
        for table in tables.values():
            # A table put aside holds its memtable, not the pages its
            # batch's lookups read of its mapped runs.
            table.release_pages()
        with self._lock:
            self._tables[key] = (version, runs, tables)
            self._tables.move_to_end(key)
            while len(self._tables) > self.capacity:
                self._tables.popitem(last=False)
            if memory is not None:
                self._trim(warm_memory(memory))

    def _trim(self, limit: int) -> None:
        # Only a table with a budget can flush: a worker also keeps warm the
        # tables of queries without one (lazily opened over their files, they
        # report runs too), which no budget of another query governs.
        held = [
            (stats["memtable_bytes"], table)
            for _, _, tables in self._tables.values()
            for table in tables.values()
            if table.state_memory is not None
            and (stats := table.spill_stats()) is not None
            and stats["memtable_bytes"] > 0
        ]
        total = sum(n for n, _ in held)
        for n, table in sorted(held, key=lambda h: -h[0]):
            if total <= limit:
                break
            table.flush()
            total -= n

    def memtable_bytes(self) -> int:
        """The warm tables' in-memory rows, by their own estimates."""
        with self._lock:
            return sum(
                stats["memtable_bytes"]
                for _, _, tables in self._tables.values()
                for table in tables.values()
                if (stats := table.spill_stats()) is not None
            )

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()


CACHE = StateCache(int(os.environ.get("SNAPCUT_STATE_CACHE", "64")))
