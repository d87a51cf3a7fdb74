"""A batch's commit into a sink root: the staged files moved into
``chk-<N>``, the manifest written, and on a local (POSIX) filesystem the
whole directory published by one atomic rename; and the removal of what no
commit names (``_staging/``, an object store's uncommitted ``chk`` dirs).
The layout and why it is atomic: :mod:`.arrow_sink`'s docstring."""

from __future__ import annotations

import contextlib
import errno
import os
import time
import uuid
from typing import Any

from snapcut import _fs
from snapcut.snapshots import SnapshotWriter, checkpoint_dir_name, file_entry
from snapcut.spark.roots import PROTOCOL
from snapcut.spark.sink.root import OUTPUT_ROLE, STAGING_DIR, SinkRoot
from snapcut.spark.sink.staging import output_file_name

__all__ = ["clean_staging", "commit_batch", "now_ms"]


def now_ms() -> int:
    return int(time.time() * 1000)


def clean_staging(root: SinkRoot) -> None:
    """Removes every staged file (uncommitted batches, losing attempts) and,
    where directories are not renamed atomically, uncommitted chk dirs."""
    staging = f"{root.path}/{STAGING_DIR}"
    if _fs.exists(root.fs, staging):
        root.fs.delete_dir(staging)
    if not root.local:
        SnapshotWriter(root.path, filesystem=root.fs).cleanup_partial(below=2**62)


def commit_batch(
    root: SinkRoot, batch_id: int, files: list[dict[str, Any]], extra: dict[str, Any], now: int
) -> None:
    """Commits batch `batch_id`: its staged `files` (the executors'
    descriptions) and the manifest's sink fields `extra`; `now`: when the
    batch started (ms)."""
    # The entries' shape is the format's (Rust); the sink adds its own fields.
    entries = [
        file_entry(
            output_file_name(f["partition"], f["file"]),
            OUTPUT_ROLE,
            f["rows"],
            f["bytes"],
            f["crc32c"],
            {k: f[k] for k in ("partition", "file", "attempt")},
        )
        for f in files
    ]
    fs, path = root.fs, root.path
    final = root.chk(batch_id)
    if root.local:
        pending_root = f"{path}/{STAGING_DIR}/commit-{batch_id:08d}-{uuid.uuid4().hex}"
        target = f"{pending_root}/{checkpoint_dir_name(batch_id)}"
    else:
        pending_root, target = path, final
    if not _fs.is_object_store(fs):
        fs.create_dir(target, recursive=True)
    for f, e in zip(files, entries, strict=True):
        fs.move(f"{path}/{f['path']}", f"{target}/{e['path']}")
    SnapshotWriter(pending_root, filesystem=fs).commit(
        batch_id,
        entries,
        protocol=PROTOCOL,
        graph_fingerprint=f"spark-sink:{extra['spark']['query_id']}",
        started_ms=now,
        finished_ms=now_ms(),
        extra=extra,
    )
    if not root.local:
        return
    local_target = _fs.local_path(fs, target)
    local_final = _fs.local_path(fs, final)
    assert local_target is not None and local_final is not None
    try:
        os.rename(local_target, local_final)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY) and root.committed(batch_id):
            return  # committed meanwhile by another run of the same batch
        raise
    _fs.fsync_dir(os.path.dirname(local_final))
    with contextlib.suppress(OSError):
        fs.delete_dir(pending_root)
