"""Type stubs of ``snapcut._core.format``: the snapshot format's rules
(rust/core/src/store/format/), for the Python backend that moves the bytes
of URI roots. Only ``snapcut.snapshots`` calls them (a test enforces it).

Files and manifests cross as bytes, tables as pyarrow objects, manifest
entries and other JSON-shaped values as the dicts ``json.loads`` would give.
"""

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from snapcut._core import SnapshotError

# Stub-only aliases (not attributes at run time): a manifest file entry
# (docs/format.md), and the caller's I/O giving a checkpoint's manifest bytes.
_Entry = dict[str, Any]
_ManifestOf = Callable[[int], bytes]

# --- names in a root ---

def checkpoint_dir_name(checkpoint_id: int) -> str: ...
def parse_checkpoint_dir(name: str) -> int | None: ...
def file_component(name: str) -> str: ...
def channel_file_name(vertex: str, subtask: int, edge: str, from_subtask: int) -> str: ...
def sources_schema() -> Any: ...

# --- reading files ---

class MappedFile:
    """A file mapped read-only, whole (one no one writes again); its pages
    can be released (rust/py/src/format/mapped.rs)."""

    def __init__(self, path: str) -> None: ...
    @property
    def address(self) -> int: ...
    @property
    def size(self) -> int: ...
    def release(self) -> None: ...

# --- writing a checkpoint ---

def encode_state(
    vertex: str,
    subtask: int,
    batch: Any,
    key: str,
    kind: str = "full",
    base: int | None = None,
    sort: bool = False,
    chain_at: tuple[int, list[int]] | None = None,
    runs_at: tuple[int, list[_Entry]] | None = None,
) -> tuple[pa.Buffer, _Entry, bytes | None]: ...
def write_state_file(
    dir: str,
    tmp_suffix: str,
    vertex: str,
    subtask: int,
    batch: Any,
    key: str,
    kind: str = "full",
    base: int | None = None,
    sort: bool = False,
    chain_at: tuple[int, list[int]] | None = None,
    direct_io: bool = False,
    runs_at: tuple[int, list[_Entry]] | None = None,
) -> _Entry: ...
def encode_ipc(batch: Any, what: str) -> tuple[bytes, int, int]: ...
def encode_channel(
    vertex: str, subtask: int, edge: str, from_subtask: int, input: int, records: Any
) -> tuple[bytes, _Entry]: ...
def encode_file(
    table: Any, path: str, role: str, fields: dict[str, Any] | None = None
) -> tuple[pa.Buffer, _Entry]: ...
def file_entry(
    path: str,
    role: str,
    rows: int,
    size: int,
    crc32c: int,
    fields: dict[str, Any] | None = None,
) -> _Entry: ...
def build_manifest(
    checkpoint_id: int,
    files: list[_Entry],
    manifest_of: _ManifestOf,
    tasks: list[tuple[str, int]],
    offsets: list[tuple[str, int, int]],
    protocol: str,
    graph_fingerprint: str,
    savepoint: bool,
    started_ms: int,
    finished_ms: int,
    committed_ms: int,
    extra: dict[str, Any],
) -> tuple[bytes, bytes]: ...
def retention(
    listing: list[tuple[str, bool]], manifest_of: _ManifestOf, retain: int
) -> dict[str, Any]: ...
def held_record(checkpoint_id: int, files: list[str], read_by: list[int]) -> bytes: ...

# --- reading a root ---

def check_manifest(data: bytes, what: str, checkpoint_id: int) -> None: ...
def scan(listing: list[tuple[str, bool]]) -> tuple[list[int], list[int], list[int]]: ...
def held_files(listing: list[tuple[str, bool]]) -> dict[int, list[str]]: ...
def missing_manifest(
    checkpoint_id: int, dir: str, root: str, dir_exists: bool, held: bool = False
) -> SnapshotError: ...
def summary(manifest: bytes, checkpoint_id: int) -> dict[str, Any]: ...
def needs(manifest: bytes, checkpoint_id: int) -> list[int]: ...
def state_files(manifest: bytes, checkpoint_id: int) -> list[tuple[str, int, _Entry]]: ...
def channel_files(
    manifest: bytes, checkpoint_id: int, vertex: str, subtask: int
) -> list[tuple[int, str, int, _Entry]]: ...
def export_plan(
    manifest: bytes, checkpoint_id: int
) -> list[tuple[str, str, int, tuple[str, int] | None, _Entry]]: ...
def state_chain(
    checkpoint_id: int,
    manifest: bytes,
    vertex: str,
    subtask: int,
    manifest_of: _ManifestOf,
) -> list[tuple[int, str, _Entry, _Entry | None, _Entry | None]] | None: ...
def rebuild_state(chain: list[tuple[str, Any]]) -> Any: ...

# --- runs (format 2) and their compaction ---

def state_runs(
    checkpoint_id: int,
    manifest: bytes,
    vertex: str,
    subtask: int,
    manifest_of: _ManifestOf,
) -> list[_Entry] | None: ...
def adopt_run(entry: _Entry, inputs: list[_Entry], output: _Entry, at: int) -> _Entry | None: ...
def adoptable(runs: list[_Entry], inputs: list[_Entry], output: _Entry) -> bool: ...
def compaction_inputs(
    vertex: str, subtask: int, runs: list[_Entry], limit: int
) -> list[tuple[int, _Entry]] | None: ...
def run_counts(entries: list[_Entry]) -> dict[str, int]: ...
def check_compaction_budget(cpu_share: float, bytes_per_s: int | None = None) -> None: ...

class RunCompactorHold:
    def release(self) -> None: ...

class RunCompactor:
    def __init__(
        self,
        root: str,
        staging: str,
        cpu_share: float = 1.0,
        bytes_per_s: int | None = None,
        pause_s: float = 0.0,
    ) -> None: ...
    def submit(
        self, vertex: str, subtask: int, key: str, runs: list[_Entry], limit: int
    ) -> bool: ...
    def wait_finished(self, timeout_s: float) -> list[dict[str, Any]]: ...
    def take_dropped(self) -> list[tuple[str, int]]: ...
    def wait_idle(self, timeout_s: float) -> bool: ...
    def hold(self) -> RunCompactorHold: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...

# --- verifying ---

def check_file(data: bytes | memoryview, entry: _Entry, checkpoint: int, path: str) -> None: ...
def missing_file(checkpoint: int, path: str) -> SnapshotError: ...
def check_structure(data: bytes, entry: _Entry) -> str | None: ...
def verify_plan(
    checkpoint_id: int, manifest: bytes, manifest_of: _ManifestOf
) -> tuple[list[tuple[int, _Entry]], list[str]]: ...
def verify(
    checkpoint_id: int,
    manifest: bytes,
    manifest_of: _ManifestOf,
    check: Callable[[int, _Entry], object],
) -> None: ...
