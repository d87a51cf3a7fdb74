"""Type stubs of the Rust extension module snapcut._core.

A stub package (this folder holds only stubs, no ``__init__.py``): the
extension module ``_core.abi3.so`` beside it is what Python imports, and its
``format`` submodule, registered in ``sys.modules``, is typed by
``format.pyi`` here."""

import builtins
from collections.abc import Callable, Iterator, Sequence
from os import PathLike
from typing import Any

# The snapshot format's rules (submodule), for snapcut.snapshots only: a test
# enforces it.
from snapcut._core import format as format
from snapcut._core.format import MappedFile

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

def _allocator_purge_delay_ms() -> int:
    """How long (ms) the allocator keeps freed pages: 1000 unless
    MIMALLOC_PURGE_DELAY says otherwise."""

def arm_failpoint(
    name: str, nth: int = 1, note_path: str | None = None, note: str | None = None
) -> None:
    """Arms a Rust crash point in this process until disarm_failpoints(): SIGKILL
    on its nth hit from now, after appending the line `note` to `note_path`."""

def disarm_failpoints() -> None:
    """Disarms every crash point arm_failpoint armed."""

# --- sim (protocol engineer) ---

class BankSim:
    def __init__(
        self,
        balances: list[tuple[str, int]],
        topology: list[tuple[str, str]] | None = None,
        seed: int = 0,
    ) -> None: ...
    @staticmethod
    def random(
        processes: int = 8,
        seed: int = 0,
        balance: int = 1000,
        topology: str = "complete",
        max_transfers: int | None = None,
    ) -> BankSim: ...
    @property
    def names(self) -> list[str]: ...
    @property
    def edges(self) -> list[tuple[str, str]]: ...
    @property
    def balances(self) -> list[int]: ...
    @property
    def total(self) -> int: ...
    @property
    def terminated(self) -> bool: ...
    def halted(self, process: str) -> bool: ...
    def send(self, src: str, dst: str, amount: int) -> None: ...
    def halt(self, process: str) -> None: ...
    def start_snapshot(self, process: str) -> int: ...
    def deliver(self, src: str, dst: str) -> tuple[str, int]: ...
    def in_flight(self, src: str, dst: str) -> list[tuple[str, int]]: ...
    def snapshot_ids(self) -> list[int]: ...
    def snapshot(self, id: int) -> dict[str, object]: ...
    def verify(self, id: int) -> str | None: ...
    def step(self) -> bool: ...
    def run(self, steps: int, snapshot_every: int | None = None) -> list[int]: ...
    def drain(self) -> list[int]: ...

def simulate_dataflow(
    protocol: str,
    seed: int = 0,
    *,
    vertices: int = 6,
    sources: int = 2,
    back_edges: int = 0,
    extra_edges: int = 3,
    tokens_per_source: int = 30,
    checkpoints: int = 5,
    max_hops: int = 6,
    end_of_stream: bool = False,
    aligned_first: bool = False,
    abort_one_in: int = 0,
) -> dict[str, object]: ...
def simulate_failover(
    protocol: str,
    failover: str,
    seed: int = 0,
    *,
    vertices: int = 7,
    sources: int = 2,
    merge_percent: int = 20,
    tokens_per_source: int = 20,
    failures: int = 2,
    dedup: bool = True,
) -> dict[str, object]: ...
def default_cost_model() -> dict[str, float]: ...
def simulate_scaling(
    protocol: str,
    nodes: int,
    records_per_node: int,
    keys_per_node: int,
    interval_s: float | None = None,
    *,
    seed: int = 0,
    cost: dict[str, float] | None = None,
) -> dict[str, object]: ...

# --- dataflow (pyflow) ---

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
    full_every: int = 10,
    compaction_cpu_share: float = 1.0,
    compaction_bytes_per_s: int | None = None,
    state_memory: int | str | None = None,
    spill_dir: str | None = None,
) -> _CheckpointConfig:
    """Builds and validates a checkpoint configuration; raises ConfigError."""

class _Checkpoint:
    @property
    def id(self) -> int: ...

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
        self,
        name: str,
        parallelism: int,
        key: str,
        specs: list[tuple[str, str, str | None]],
        forward: bool = False,
    ) -> int: ...
    def add_iteration_head(self, name: str, parallelism: int) -> int: ...
    def add_collect(self, name: str, parallelism: int, result: str) -> int: ...
    def add_arrow_sink(self, name: str, parallelism: int, path: str) -> int: ...
    def run(
        self,
        checkpointing: _CheckpointConfig,
        restore_from: _Checkpoint | None = None,
        checkpoint_dir: str | None = None,
        resume: bool = False,
        restart_attempts: int = 0,
        restart_delay: float = 1.0,
        failover: str = "region",
        control: _JobControl | None = None,
        fsync: str = "syncfs",
        channel_capacity: int = 64,
        failure: tuple[str, int, str, int] | None = None,
        direct_io: bool = True,
    ) -> dict[str, Any]:
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

# --- state / store ---

SNAPSHOT_FORMAT: dict[str, Any]

def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`: the checksum of every snapshot file."""

def state_memory_bytes(value: int | str) -> int:
    """A state memory budget in bytes from bytes or a size ("256MB", binary
    units as Spark reads them): ConfigError unless it parses and is >= 1 MiB."""

def size_bytes(value: int | str) -> int:
    """A size in bytes from bytes or a size string, as state_memory_bytes
    reads it, with no minimum: ConfigError (a string) or ValueError (another
    value) unless it parses."""

def storable_type(data_type: Any) -> bool:
    """Whether a StateTable column holds this pyarrow DataType natively."""

def key_buckets(keys: Any, buckets: int) -> Any:
    """Each key's bucket among `buckets` (a pyarrow uint32 array), by its
    hash: every row of a key gets the same bucket in every process.
    ConfigError on a null key, a non-key type or 0 buckets."""

class StateRuns:
    """A capture left as sorted runs (`StateTable.checkpoint_streamed`):
    only the snapshot writer reads it."""

    @property
    def schema(self) -> Any: ...
    @property
    def rows_in(self) -> int: ...

class StateTable:
    """Keyed state table with change tracking for incremental checkpoints."""

    def __init__(
        self,
        schema: Any,
        key: str,
        full_every: int = 10,
        group: str | None = None,
        state_memory: int | str | None = None,
        spill_dir: str | PathLike[str] | None = None,
        time_column: str | None = None,
        group_prefix: str | None = None,
        mapped_memory: int | str | None = None,
    ) -> None:
        """`mapped_memory` (needs `state_memory`): about the most of the mapped
        runs' pages lookups leave resident before releasing them.
        `state_memory`: bytes (or "256MB") of rows kept in memory; past
        it they spill to sorted runs mapped from files under `spill_dir`
        (default: the temp dir). None: all in memory. `time_column`: an
        int64 column (ms) indexed for `due` (timers, TTL, timeouts).
        `group_prefix`: what every (binary) key begins with, "value" (the
        `group` column's bytes) or "encoding" (`encode_keys([group])`); a
        table with a group and a `state_memory` needs it."""
    @property
    def state_memory(self) -> int | None: ...
    @property
    def time_column(self) -> str | None: ...
    def due(self, threshold: int) -> Any:
        """Keys whose time is at or before `threshold`, by time then key (a
        pyarrow Array), from the time index: the table is not read (with
        `state_memory`, the index's spilled entries a threshold passed are
        checked against their rows)."""
    def earliest_time(self) -> int | None:
        """The time index's earliest time (None: empty, or no index)."""
    def spill_stats(self) -> dict[str, int] | None:
        """flushes, rows_flushed, bytes_flushed, merges, run_probes, run_hits,
        runs, memtable_bytes, bases_mapped and diffs_mapped (a mapped restore's
        full and diffs taken as runs as they are), filters_stored and
        times_stored (the stored filters and time index a restore took),
        time_flushes, time_merges and
        time_runs (the time index's entries moved into runs) (None without
        state_memory)."""
    def flush(self) -> None:
        """Moves the in-memory rows into a run now (needs state_memory)."""
    def update(self, batch: Any) -> None:
        """Upserts the rows of a pyarrow RecordBatch or Table by key."""
    def lookup_groups(self, groups: Any) -> tuple[Any, Any]:
        """(pyarrow.RecordBatch, pyarrow.UInt32Array): every row of the asked
        groups and each row's group position among `groups`."""
    def delete_groups(self, groups: Any) -> int:
        """Deletes every row of the asked groups; returns how many rows went."""
    @property
    def group(self) -> str | None: ...
    def get(self, keys: Any) -> Any:
        """pyarrow Table of the present keys' rows, in the order asked."""
    def lookup(self, keys: Any) -> tuple[Any, Any]:
        """(pyarrow.RecordBatch, pyarrow.BooleanArray present): one row per key asked,
        in order, duplicates included; an absent key's row is the key and nulls."""
    def delete(self, keys: Any) -> int:
        """Deletes keys (absent ones ignored); returns how many were present."""
    def diff(self) -> Any:
        """Changes since the last checkpoint: a RecordBatch with `__deleted`."""
    def checkpoint(self, id: int | None = None) -> tuple[int, str, Any]:
        """(id, "full" | "diff", RecordBatch); a diff is based on `last_base`."""
    def checkpoint_streamed(self, id: int | None = None) -> tuple[int, str, Any]:
        """As `checkpoint`, the capture a `StateRuns` when runs hold part of
        the state (merged as `format.write_state_file` writes it), else the
        RecordBatch `checkpoint` returns."""
    def checkpoint_aborted(self) -> None: ...
    def confirm_bases(self) -> None:
        """Base diffs on the last id passed to `checkpoint_committed`."""
    def checkpoint_committed(self, id: int) -> None: ...
    @property
    def last_base(self) -> int | None: ...
    def restore(
        self,
        chain: Sequence[tuple[int, str, Any]],
        *,
        mapped: bool = False,
        filters: Sequence[bytes | None] | None = None,
        pages: Sequence[MappedFile | None] | None = None,
        times: Any = None,
    ) -> None:
        """State at the end of a chain [(id, "full", batch), (id, "diff", batch), ...].
        mapped: the batches are mapped files no one writes again; with a memory
        budget a sorted full becomes the base run as it is (no copy).
        filters: per file, the bloom filter stored beside it (checked), or None.
        pages: with mapped, per file the MappedFile it was read from, or None:
        the runs keep its pages and release what reads bring in.
        times: the time index stored beside the full (format 5, checked), or
        None: a table indexed by its column takes it instead of reading every
        row's time."""
    def release_pages(self) -> None:
        """Releases the pages reads brought in of the table's mapped runs."""
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

class KeyedAggregates:
    """Built-in aggregates per key whose accumulators live in a StateTable.

    specs: (func, column or None, output) with func one of count, sum, min, max,
    mean, first, last; column None only for count (rows, count(*)).
    """

    def __init__(
        self,
        input_schema: Any,
        key: str,
        specs: Sequence[tuple[str, str | None, str]],
    ) -> None: ...
    @property
    def state_schema(self) -> Any:
        """pyarrow.Schema of the StateTable: key, then accumulators (mean m: m__sum, m__count)."""
    @property
    def output_schema(self) -> Any:
        """pyarrow.Schema of output(): key, then one column per spec."""
    @property
    def key(self) -> str: ...
    def apply(self, table: StateTable, batch: Any) -> Any:
        """Folds a RecordBatch/Table into `table`; returns the touched keys' merged
        state rows (pyarrow.RecordBatch, one per key, in order of first appearance)."""
    def output(self, state_rows: Any) -> Any:
        """pyarrow.RecordBatch of results (mean = sum / count) for state rows."""

def encode_keys(columns: Any) -> Any:
    """pyarrow.BinaryArray: one key per row of a Table, RecordBatch or list of arrays;
    equal rows (and only those) get equal bytes in every process."""

class SnapshotReader:
    """Read access to a local snapshot root (the Rust reader)."""

    def __init__(self, root: str | PathLike[str]) -> None: ...
    def list(self) -> builtins.list[int]: ...
    def partial(self) -> builtins.list[int]: ...
    def held(self) -> dict[int, builtins.list[str]]: ...
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
        fsync: str = "syncfs",
        compaction_cpu_share: float = 1.0,
        compaction_bytes_per_s: int | None = None,
        direct_io: bool = True,
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
    def wait_for_compactions(self, timeout: float) -> bool: ...
    def compaction_stats(self) -> dict[str, float]:
        """The fields of `snapcut.CompactionStats`."""
    def completed(self) -> builtins.list[int]: ...
    @property
    def root(self) -> str: ...

# --- channel ---

class Sender:
    """The sending end of a bounded FIFO channel of Python objects (one producer thread)."""

    @property
    def capacity(self) -> int: ...
    @property
    def is_closed(self) -> bool:
        """Whether the receiver (or this end) was closed."""

    def send(self, obj: object, timeout: float | None = None) -> None:
        """Sends `obj`, waiting (GIL released) while full; TimeoutError after `timeout` s."""

    def try_send(self, obj: object) -> bool:
        """Sends `obj` if there is room; returns whether it was sent."""

    def send_many(self, objs: list[Any], timeout: float | None = None) -> None:
        """Sends every object in order, as many at once as fit, waiting for room."""

    def close(self) -> None:
        """Closes this end: the receiver drains what is queued, then gets ChannelClosedError."""

    def __len__(self) -> int: ...
    def __enter__(self) -> Sender: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...

class Receiver:
    """The receiving end of a bounded FIFO channel of Python objects (one consumer thread)."""

    @property
    def capacity(self) -> int: ...
    @property
    def is_closed(self) -> bool:
        """Whether the sender (or this end) was closed; objects may still be queued."""

    def recv(self, timeout: float | None = None) -> Any:
        """The oldest object, waiting (GIL released) while empty; ChannelClosedError when
        the sender is closed and the channel drained; TimeoutError after `timeout` s."""

    def try_recv(self, default: object = None) -> Any:
        """The oldest object if one is queued, else `default`."""

    def recv_many(self, max: int, timeout: float | None = None) -> list[Any]:
        """Up to `max` queued objects, oldest first, waiting for at least one."""

    def try_recv_many(self, max: int) -> list[Any]:
        """Up to `max` objects queued right now (possibly none)."""

    def close(self) -> None:
        """Closes this end and releases the queued objects; the sender gets ChannelClosedError."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Any]: ...
    def __next__(self) -> Any: ...
    def __enter__(self) -> Receiver: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...

def channel(capacity: int) -> tuple[Sender, Receiver]:
    """A bounded FIFO channel for `capacity` objects; ConfigError if capacity is 0."""

# --- recovery ---
class _JobControl:
    def __init__(self) -> None: ...
    @property
    def started(self) -> bool: ...
    def trigger_savepoint(self) -> None: ...
    def trigger_checkpoint(self) -> None: ...
    def cancel(self) -> None: ...
    def checkpoints(self) -> tuple[int, int, int]: ...

# --- keyed process (incremental state) ---
def _keyed_checkpoints(
    key: str,
    func: Callable[..., Any],
    steps: list[list[Any]],
    full_every: int,
    aborted: list[int] = ...,
    timings: list[int] | None = None,
    state_memory: int | None = None,
    spill_dir: str | PathLike[str] | None = None,
    spill: list[dict[str, int] | None] | None = None,
) -> list[tuple[str, int | None, Any]]:
    """Test hook: a keyed process fed steps[i] then checkpointed as i + 1
    (spilling past `state_memory` bytes under `spill_dir`; `spill` gets its
    spill_stats() at the end)."""

def _keyed_restore(
    key: str,
    func: Callable[..., Any],
    chain: list[tuple[str, int | None, Any]],
    after: list[Any],
    state_memory: int | None = None,
    spill_dir: str | PathLike[str] | None = None,
    spill: list[dict[str, int] | None] | None = None,
) -> tuple[list[Any], Any]:
    """Test hook: a keyed process restored from a chain, then fed `after`."""
