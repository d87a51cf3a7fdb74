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

# --- dataflow (pyflow) ---
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

class _CheckpointConfig:
    @property
    def protocol(self) -> str: ...

def checkpoint_config(
    protocol: str,
    interval: float | None,
    timeout: float,
    min_pause: float,
    max_concurrent: int,
    tolerable_failures: int,
    retained: int,
    alignment_timeout: float,
    final_checkpoint: bool,
) -> _CheckpointConfig:
    """Builds and validates a checkpoint configuration; raises ConfigError."""

class _GraphBuilder:
    def __init__(self) -> None: ...
    def add_python_source(
        self, name: str, parallelism: int, make_iter: Callable[[], Iterator[Any]]
    ) -> int: ...
    def add_batches_source(self, name: str, parallelism: int, batches: list[Any]) -> int: ...
    def add_udf(self, name: str, parallelism: int, kind: str, func: Callable[..., Any]) -> int: ...
    def add_keyed_process(
        self, name: str, parallelism: int, key: str, func: Callable[..., Any]
    ) -> int: ...
    def add_union(self, name: str, parallelism: int) -> int: ...
    def connect(
        self,
        from_vertex: int,
        to_vertex: int,
        partitioning: str,
        key: str | None = None,
        feedback: bool = False,
    ) -> int: ...
    def add_dwell_events(
        self, name: str, parallelism: int, users: int, count: int, seed: int, batch_size: int
    ) -> int: ...
    def add_aggregate(
        self, name: str, parallelism: int, key: str, specs: list[tuple[str, str, str | None]]
    ) -> int: ...
    def add_iteration_head(self, name: str, parallelism: int) -> int: ...
    def add_collect(self, name: str, parallelism: int, result: str) -> int: ...
    def add_arrow_sink(self, name: str, parallelism: int, path: str) -> int: ...
    def run(self, checkpointing: _CheckpointConfig) -> dict[str, Any]:
        """Runs the job with the GIL released; returns the raw report."""

def dwell_events(users: int, count: int, seed: int) -> Any:
    """The built-in generator's events as a pyarrow.Table (all subtasks)."""
def _replay_source(
    subtask: int,
    parallelism: int,
    offset: int,
    make_iter: Callable[[], Iterator[Any]] | None = None,
    batches: list[Any] | None = None,
) -> tuple[list[Any], int]:
    """Test hook: one source subtask sought to `offset` and read to its end."""

def _keyed_roundtrip(
    key: str, func: Callable[..., Any], before: list[Any], after: list[Any]
) -> tuple[Any, list[Any], Any]:
    """Test hook: keyed process snapshot → restore → continue."""
