"""Creating or checking a state root before the query starts, where its
tasks will write it.

On a classic session the caller is the driver, which sees the filesystem the
tasks see. A Spark Connect client may be another machine: a local root path
names the server's and executors' disks, not the client's. So under Connect
the check runs as a one-task Spark job, and its outcome (or the typed error
it raised) comes back to the client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from snapcut import _core
from snapcut.spark.session_kind import is_connect
from snapcut.spark.state.root import StateRoot

__all__ = ["prepare_root"]

_RESULT = pa.schema([("result", pa.string())])


def prepare_root(session: Any, root: StateRoot, operator: str) -> bool:
    """Creates the root or checks that it holds this operator's state
    (:meth:`StateRoot.init`); returns whether it already has a committed
    batch (a restart: an initial state is then not written)."""
    if not is_connect(session):
        return _prepare(root, operator)
    job = session.range(1, numPartitions=1).mapInArrow(_Remote(root, operator), "result string")
    (row,) = job.collect()
    outcome = json.loads(row["result"])
    if "error" in outcome:
        kind = getattr(_core, outcome["type"], None)
        if not (isinstance(kind, type) and issubclass(kind, _core.SnapcutError)):
            kind = _core.StorageError
        raise kind(outcome["error"])
    return bool(outcome["committed"])


def _prepare(root: StateRoot, operator: str) -> bool:
    root.init(operator)
    return bool(root.backend.complete())


class _Remote:
    """The one task of the Connect job (picklable)."""

    def __init__(self, root: StateRoot, operator: str) -> None:
        self.root = root
        self.operator = operator

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        try:
            outcome: dict[str, Any] = {"committed": _prepare(self.root, self.operator)}
        except _core.SnapcutError as e:
            outcome = {"type": type(e).__name__, "error": str(e)}
        yield pa.RecordBatch.from_pylist([{"result": json.dumps(outcome)}], schema=_RESULT)
