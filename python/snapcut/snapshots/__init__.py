"""Reading (and writing) snapcut snapshots: Arrow IPC files plus a manifest.

    >>> snaps = snapcut.snapshots.open("/tmp/ckpt")        # local: the Rust store
    >>> snaps = snapcut.snapshots.open("s3://bucket/ckpt")  # any pyarrow.fs URI
    >>> chk = snaps.latest()
    >>> chk.state("agg", 0)            # full state, rebuilt from full + diffs
    >>> chk.channels("agg", 0), chk.source_offsets(), chk.meta
    >>> snaps.verify()                 # {id: None | "why it is broken"}
    >>> snapcut.snapshots.changes("/data/state", 3, 7)   # Spark's change feed columns

Local paths go through the Rust reader; URIs (and explicit pyarrow
filesystems) through the pure-Python reader below, on the same format and
the same manifest constants (``snapcut._core.SNAPSHOT_FORMAT``).
:class:`SnapshotWriter` writes that format from Python (e.g. from Spark
workers: files per partition, then one manifest from the driver).
"""

from snapcut.snapshots.backend import Backend, FsBackend
from snapcut.snapshots.change_feed import changes
from snapcut.snapshots.layout import (
    CHECKPOINT_DIR_PREFIX,
    DELETED_COLUMN,
    FORMAT_NAME,
    FORMAT_VERSION,
    KEY_METADATA,
    LIVE_KEYS_METADATA,
    MANIFEST_FILE,
    MANIFEST_TMP_FILE,
    SOURCES_FILE,
    SOURCES_SCHEMA,
    TIME_METADATA,
    Channel,
    Task,
    checkpoint_dir_name,
    file_component,
    rebuild_state,
)
from snapcut.snapshots.ops import (
    CheckpointCheck,
    CheckpointInfo,
    CheckpointRow,
    FileCheck,
    PruneResult,
    TaskInfo,
    list_checkpoints,
    prune,
    show_checkpoint,
    verify_checkpoints,
)
from snapcut.snapshots.reader import Checkpoint, Snapshots, open
from snapcut.snapshots.tables import (
    ExportedTable,
    ExportResult,
    TaskDiff,
    diff_checkpoints,
    export_checkpoint,
)
from snapcut.snapshots.writer import SnapshotWriter, encode_ipc, file_entry

__all__ = [
    "CHECKPOINT_DIR_PREFIX",
    "DELETED_COLUMN",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "KEY_METADATA",
    "LIVE_KEYS_METADATA",
    "MANIFEST_FILE",
    "MANIFEST_TMP_FILE",
    "SOURCES_FILE",
    "SOURCES_SCHEMA",
    "TIME_METADATA",
    "Backend",
    "Channel",
    "Checkpoint",
    "CheckpointCheck",
    "CheckpointInfo",
    "CheckpointRow",
    "ExportResult",
    "ExportedTable",
    "FileCheck",
    "FsBackend",
    "PruneResult",
    "SnapshotWriter",
    "Snapshots",
    "Task",
    "TaskDiff",
    "TaskInfo",
    "changes",
    "checkpoint_dir_name",
    "diff_checkpoints",
    "encode_ipc",
    "export_checkpoint",
    "file_component",
    "file_entry",
    "list_checkpoints",
    "open",
    "prune",
    "rebuild_state",
    "show_checkpoint",
    "verify_checkpoints",
]
