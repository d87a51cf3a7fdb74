"""Type stubs of the Rust extension module snapcut._core."""

__version__: str

class SnapcutError(Exception): ...
class ChannelClosedError(SnapcutError): ...
class ConfigError(SnapcutError): ...
class GraphError(SnapcutError): ...
class SnapshotError(SnapcutError): ...
class TaskError(SnapcutError): ...
class StorageError(SnapcutError): ...

def protocol_name(name: str) -> str:
    """Validates a protocol name; returns its canonical spelling or raises ConfigError."""

# --- state / store ---
import builtins  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from os import PathLike  # noqa: E402
from typing import Any  # noqa: E402

SNAPSHOT_FORMAT: dict[str, Any]

def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`: the checksum of every snapshot file."""

class StateTable:
    """Keyed state table with change tracking for incremental checkpoints."""

    def __init__(self, schema: Any, key: str, full_every: int = 10) -> None: ...
    def update(self, batch: Any) -> None:
        """Upserts the rows of a pyarrow RecordBatch or Table by key."""
    def get(self, keys: Any) -> Any:
        """pyarrow Table of the present keys' rows, in the order asked."""
    def delete(self, keys: Any) -> int:
        """Deletes keys (absent ones ignored); returns how many were present."""
    def diff(self) -> Any:
        """Changes since the last checkpoint: a RecordBatch with `__deleted`."""
    def checkpoint(self, id: int | None = None) -> tuple[int, str, Any]:
        """(id, "full" | "diff", RecordBatch); a diff is based on the previous id."""
    def checkpoint_aborted(self) -> None: ...
    def restore(self, chain: Sequence[tuple[int, str, Any]]) -> None:
        """State at the end of a chain [(id, "full", batch), (id, "diff", batch), ...]."""
    def to_arrow(self) -> Any: ...
    @property
    def schema(self) -> Any: ...
    @property
    def key(self) -> str: ...
    @property
    def full_every(self) -> int: ...
    @property
    def last_checkpoint(self) -> int | None: ...
    @property
    def changed(self) -> int: ...
    def __len__(self) -> int: ...

class SnapshotReader:
    """Read access to a local snapshot root (the Rust reader)."""

    def __init__(self, root: str | PathLike[str]) -> None: ...
    def list(self) -> builtins.list[int]: ...
    def partial(self) -> builtins.list[int]: ...
    def manifest(self, id: int) -> str: ...
    def verify(self, id: int) -> str: ...
    def latest_intact(self) -> tuple[int, builtins.list[tuple[int, str]]]: ...
    def next_checkpoint_id(self) -> int: ...
    def state(self, id: int, vertex: str, subtask: int) -> Any | None: ...
    def channels(
        self, id: int, vertex: str, subtask: int
    ) -> builtins.list[tuple[int, str, int, Any]]: ...

class SnapshotStore:
    """The durable store on a local path (what the runtime writes through)."""

    def __init__(
        self,
        root: str | PathLike[str],
        retain: int = 3,
        cleanup_partial_on_open: bool = True,
        materialize_every: int | None = None,
    ) -> None: ...
    def task_snapshot(
        self,
        id: int,
        vertex: str,
        subtask: int,
        state: tuple[str, int | None, Any] | None = None,
        source_offset: int | None = None,
        channels: Sequence[tuple[int, str, int, Any]] = ...,
        alignment_nanos: int = 0,
    ) -> None: ...
    def commit(
        self,
        id: int,
        protocol: str = "aligned",
        graph_fingerprint: str = "",
        savepoint: bool = False,
        started_ms: int = 0,
        finished_ms: int = 0,
    ) -> None: ...
    def abort(self, id: int) -> None: ...
    def completed(self) -> builtins.list[int]: ...
    @property
    def root(self) -> str: ...
