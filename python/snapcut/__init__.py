"""snapcut: consistent global snapshots for streaming dataflows.

Chandy-Lamport markers and Flink-style Asynchronous Barrier Snapshotting in a
Rust core, with a Python API and PySpark helpers. Snapshots are Arrow IPC files
plus a JSON manifest, readable without snapcut.
"""

from snapcut._core import (
    ChannelClosedError,
    ConfigError,
    GraphError,
    SnapcutError,
    SnapshotError,
    StateTable,
    StorageError,
    TaskError,
    __version__,
)

__all__ = [
    "ChannelClosedError",
    "ConfigError",
    "GraphError",
    "SnapcutError",
    "SnapshotError",
    "StateTable",
    "StorageError",
    "TaskError",
    "__version__",
    "snapshots",
]

from snapcut import snapshots
