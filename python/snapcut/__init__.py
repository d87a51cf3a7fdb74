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
from snapcut._fs import ObjectStoreError
from snapcut.checkpointing import (
    ChannelLog,
    Checkpointing,
    CheckpointMetrics,
    CompactionStats,
    Snapshot,
    StoreMetrics,
    TaskState,
)
from snapcut.dataflow import (
    CheckpointCounts,
    Dataflow,
    JobControl,
    KeyedStream,
    Restart,
    RunReport,
    Stream,
    TaskFailure,
)

__all__ = [
    "ChannelClosedError",
    "ChannelLog",
    "CheckpointCounts",
    "CheckpointMetrics",
    "Checkpointing",
    "CompactionStats",
    "ConfigError",
    "Dataflow",
    "GraphError",
    "JobControl",
    "KeyedStream",
    "ObjectStoreError",
    "Restart",
    "RunReport",
    "SnapcutError",
    "Snapshot",
    "SnapshotError",
    "StateTable",
    "StorageError",
    "StoreMetrics",
    "Stream",
    "TaskError",
    "TaskFailure",
    "TaskState",
    "__version__",
    "snapshots",
]

from snapcut import snapshots
