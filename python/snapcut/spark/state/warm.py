"""A Python worker's state memory: how a budget splits between the partition
a task works on and the partitions the worker keeps warm, and the warm tables
themselves (:class:`StateCache`), put back only once their version is durable.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence

from snapcut._core import ConfigError, StateTable
from snapcut.spark.state.spec import TableLayout

__all__ = [
    "CACHE",
    "MIN_TABLE_MEMORY",
    "Chains",
    "StateCache",
    "Tables",
    "mapped_memory",
    "table_memory",
]

MIN_TABLE_MEMORY = 1 << 20
"""The least budget of one spilling table (Rust's MIN_STATE_MEMORY)."""


def table_memory(state_memory: int, layouts: Sequence[TableLayout]) -> int:
    """Each table's budget under a Python worker's `state_memory`: half of
    it goes to the partition a task works on, shared by its tables; the
    other half bounds the warm tables of the partitions the worker keeps
    (:meth:`StateCache.put`). ConfigError if a table would get less than
    1 MiB, naming the least budget that works."""
    spilling = max(len(layouts), 1)
    least = 2 * spilling * MIN_TABLE_MEMORY
    if state_memory < least:
        raise ConfigError(
            f"state_memory of {state_memory} bytes is below the minimum of {least} bytes a "
            f"Python worker needs for this step's {spilling} spilling state table(s): half of "
            "it goes to the partition a task works on, at least 1 MiB a table, and half to the "
            "partitions it keeps warm; raise it, or leave it unset for no limit"
        )
    return state_memory // 2 // spilling


def mapped_memory(table_memory: int) -> int:
    """The pages of a table's mapped runs its lookups may leave resident:
    a quarter of its memory (at least 1 MiB). A worker's resident set is what
    a container's memory limit sees, and random lookups over a partition's
    runs would otherwise leave every page of them there (issue 37)."""
    return max(table_memory // 4, MIN_TABLE_MEMORY)


Tables = dict[str, StateTable]
"""A partition's state tables by vertex (one, or one per state variable)."""
Chains = dict[str, list[int]]


class StateCache:
    """This process's warm state: (root, vertex, partition) → (version, the
    chain of checkpoints each table was written as, the tables).

    A table is taken out while a task works on it and put back only when its
    version is durable, so a failed task never leaves a half-applied table.
    The chain is the one its state file's entry holds (the task wrote both),
    so a warm task reads nothing of the previous version but its manifest.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._tables: OrderedDict[tuple[str, str, int], tuple[int, Chains, Tables]] = OrderedDict()

    def take(self, key: tuple[str, str, int], version: int) -> tuple[Tables, Chains] | None:
        """The tables at `version` and their chains, or None (taken out either way)."""
        with self._lock:
            hit = self._tables.pop(key, None)
        if hit is None or hit[0] != version:
            return None
        return hit[2], hit[1]

    def put(
        self,
        key: tuple[str, str, int],
        version: int,
        chains: Chains,
        tables: Tables,
        memory: int | None = None,
    ) -> None:
        """Keeps `tables` warm; with a worker budget `memory`, then flushes
        the largest in-memory rows of the warm tables that have a budget
        until they hold at most half of it (the other half is the working
        partition's)."""
        for table in tables.values():
            # A table put aside holds its memtable, not the pages its
            # batch's lookups read of its mapped runs.
            table.release_pages()
        with self._lock:
            self._tables[key] = (version, chains, tables)
            self._tables.move_to_end(key)
            while len(self._tables) > self.capacity:
                self._tables.popitem(last=False)
            if memory is not None:
                self._trim(memory // 2)

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
