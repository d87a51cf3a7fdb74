"""This process's compactor of each state root (issue 37): a local root's
(:class:`~snapcut.spark.state.compaction.WorkerCompactor`) or a remote
root's (:class:`~snapcut.spark.state.remote_compaction.RemoteCompactor`),
started by the first task that commits to the root in this process."""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from snapcut import _fs
from snapcut.snapshots.run_cache import shared
from snapcut.spark.state.compaction import WorkerCompactor
from snapcut.spark.state.remote_compaction import MIN_RETAIN, RemoteCompactor
from snapcut.spark.state.spec import RootSpec

__all__ = ["compactor_for"]

_COMPACTORS: dict[str, WorkerCompactor] = {}
_COMPACTORS_PID = os.getpid()
_COMPACTORS_LOCK = threading.Lock()


@atexit.register
def _close_all() -> None:
    """A process that exits normally closes its compactors: their claims
    given up, their directories removed. PySpark's workers forked by its
    daemon leave by ``os._exit`` (no exit hooks): theirs are removed by the
    next compactor started on the machine, their claims taken over as a
    dead process's."""
    with _COMPACTORS_LOCK:
        if os.getpid() != _COMPACTORS_PID:
            return  # a forked child's copies: its parent's to close
        found = list(_COMPACTORS.values())
        _COMPACTORS.clear()
    for compactor in found:
        compactor.close()


def compactor_for(spec: RootSpec, fs: Any, path: str) -> WorkerCompactor | None:
    """This process's compactor of the root at `path` on `fs`, paced as
    `spec` says; None where its commits write fulls themselves: compaction
    turned off, or a remote root without a run cache (its inputs are read
    from it) or with `retain` below
    :data:`~snapcut.spark.state.remote_compaction.MIN_RETAIN`."""
    global _COMPACTORS_PID
    if not spec.compaction:
        return None
    local = _fs.local_path(fs, path)
    cache = None
    if local is None:
        cache = shared(spec.run_cache)
        if cache is None or spec.retain < MIN_RETAIN:
            return None
    key = local if local is not None else f"remote:{path}"
    with _COMPACTORS_LOCK:
        if os.getpid() != _COMPACTORS_PID:
            # A forked worker: its parent's threads did not come along.
            _COMPACTORS.clear()
            _COMPACTORS_PID = os.getpid()
        found = _COMPACTORS.get(key)
        if found is None:
            cpu, rate = spec.compaction_cpu_share, spec.compaction_bytes_per_s
            if cache is None:
                assert local is not None
                found = WorkerCompactor(local, cpu, rate)
            else:
                found = RemoteCompactor(fs, path, cache, cpu, rate)
            _COMPACTORS[key] = found
        return found
