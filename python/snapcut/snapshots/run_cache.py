"""A local cache of a remote root's state files (issue 37), as Flink's
ForSt keeps a local cache of its remote files: a Python worker that restores
a partition from an object store downloads each file it needs once into a
local directory, checks it, and maps it, so the table opens it lazily (its
base run read in place, only the pages a batch touches) instead of holding
the whole file on the heap and copying its base into a local run.

Snapshot files are never rewritten (a committed file keeps its bytes), so a
cached copy stays valid as long as it is there: a file is named by a hash of
its remote path and by the size and CRC-32C its manifest entry gives, and is
checked against them every time it is used. A copy that fails the check is
deleted and fetched again; a remote file that fails it is the format's
error, naming the remote path.

The cache holds at most ``max_bytes`` of files: after each download the
least recently used files go (oldest use first, never the file just
fetched) until the rest fit. A file still mapped by a table stays readable
after it goes (the mapping keeps its pages); only a later use fetches it
again. Downloads in flight are not counted (they are temporary files until
they are complete), so the directory can exceed the limit by the files being
fetched at that moment. A file larger than the whole limit is not cached:
it is read into memory as without a cache. Several processes may share a
directory: files appear by an atomic rename and are only ever deleted
whole.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from snapcut import _fs
from snapcut._core import ConfigError, SnapshotError, StorageError, size_bytes
from snapcut._core import format as fmt
from snapcut.snapshots.mapped import MappedRead, checked, map_file

__all__ = [
    "DEFAULT_RUN_CACHE_BYTES",
    "RunCache",
    "RunCacheSpec",
    "RunCacheStats",
    "default_directory",
]

DEFAULT_RUN_CACHE_BYTES = 2 << 30
"""2 GiB: the size limit when none is given."""

_CHUNK = 32 << 20
"""Bytes a download reads and writes at a time (a ranged GET each on an
object store: fewer, larger requests fetch faster; this bounds the memory a
download holds)."""

_STALE_TMP_S = 3600.0
"""A temporary file this old is a download whose process died: removed."""

_SUFFIX = ".arrow"


def default_directory() -> str:
    """``<temp dir>/snapcut-run-cache-<uid>``: the directory when none is given."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"snapcut-run-cache-{uid}")


@dataclass(frozen=True)
class RunCacheSpec:
    """Where a worker caches a remote root's files and how much it keeps.
    `directory` None: :func:`default_directory` on the worker (its own temp
    dir, not the driver's). `max_bytes` 0: no cache (files read into memory)."""

    directory: str | None = None
    max_bytes: int = DEFAULT_RUN_CACHE_BYTES

    @classmethod
    def parse(
        cls, size: int | str | None, directory: str | os.PathLike[str] | None
    ) -> RunCacheSpec:
        """A spec from a user's size (bytes, or ``"2GB"`` as Spark writes
        sizes; None: the default; 0 or ``"0"``: off) and directory."""
        bad = ConfigError(
            f"run cache size {size!r} is not a size: give bytes (2147483648), a size with a "
            "unit (2GB, binary units as Spark reads them), or 0 for no cache"
        )
        if size is None:
            max_bytes = DEFAULT_RUN_CACHE_BYTES
        elif isinstance(size, bool) or not isinstance(size, int | str):
            raise bad
        else:
            try:
                max_bytes = size_bytes(size)
            except (ConfigError, ValueError, OverflowError):
                raise bad from None
        return cls(None if directory is None else os.fspath(directory), max_bytes)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0


@dataclass
class RunCacheStats:
    """What a cache did so far in this process."""

    hits: int = 0
    misses: int = 0
    bytes_fetched: int = 0
    evicted: int = 0
    refetched: int = 0
    """Cached copies that failed their check and were fetched again."""
    too_large: int = 0
    """Files larger than the whole limit, read into memory instead."""

    def copy(self) -> RunCacheStats:
        return RunCacheStats(**vars(self))


@dataclass
class RunCache:
    """One cache directory, used by this process (see the module docs)."""

    directory: Path
    max_bytes: int
    stats: RunCacheStats = field(default_factory=RunCacheStats)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ConfigError(
                f"a run cache needs a size limit of at least 1 byte, got {self.max_bytes}"
            )
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f".probe-{os.getpid()}-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise ConfigError(
                f"run cache directory {self.directory} cannot be written ({e.strerror or e}): "
                "give a local directory the Python workers may write "
                "(spark.snapcut.state.runCacheDir), or turn the cache off "
                "(spark.snapcut.state.runCacheSize=0)"
            ) from e

    def fetch(
        self, fs: Any, path: str, entry: dict[str, Any], checkpoint_id: int
    ) -> MappedRead | None:
        """The file `path` of `fs` (manifest entry `entry`: its ``bytes``
        and ``crc32c``), mapped from its cached copy, downloaded first if
        there is none; checked against the entry either way. None: the file
        is larger than the whole cache (the caller reads it as it is)."""
        size = int(entry["bytes"])
        if size > self.max_bytes:
            with self._lock:
                self.stats.too_large += 1
            return None
        name = self._name(path, entry)
        local = self.directory / name
        cached = self._open_cached(local, entry, checkpoint_id, path)
        if cached is not None:
            with self._lock:
                self.stats.hits += 1
            return cached
        self._download(fs, path, local, checkpoint_id)
        data = self._map(local, path)
        if data is None:
            # Another process evicted it between our rename and this map:
            # the bytes are fetched again rather than trusted to luck.
            self._download(fs, path, local, checkpoint_id)
            data = self._map(local, path)
            if data is None:
                raise SnapshotError(
                    f"run cache file {local} vanished twice right after its download: another "
                    "process is evicting as fast as this one fetches; give the cache more room "
                    "(spark.snapcut.state.runCacheSize)"
                )
        try:
            checked(data, lambda view: fmt.check_file(view, entry, checkpoint_id, path))
        except SnapshotError:
            _unlink(local)
            raise
        with self._lock:
            self.stats.misses += 1
            self.stats.bytes_fetched += size
        self._evict(keep=local)
        return data

    def link(self, fs: Any, path: str, entry: dict[str, Any], checkpoint_id: int, dst: str) -> None:
        """The file `path` of `fs` also at the local path `dst`, a hard link
        of its cached copy (fetched and checked first, as :meth:`fetch`), so
        an eviction meanwhile does not take it from whoever reads `dst` (a
        remote root's compactor). A file larger than the whole cache is
        downloaded to `dst` itself (whoever reads it checks it)."""
        for _ in range(2):
            if self.fetch(fs, path, entry, checkpoint_id) is None:
                self._download(fs, path, Path(dst), checkpoint_id)
                return
            try:
                os.link(self.directory / self._name(path, entry), dst)
                return
            except FileNotFoundError:
                continue  # evicted between the fetch and the link
            except FileExistsError:
                return
            except OSError as e:
                raise self._unusable(path, e) from e
        raise SnapshotError(
            f"run cache file for {path} was evicted twice right after its fetch: another "
            "process is evicting as fast as this one fetches; give the cache more room "
            "(spark.snapcut.state.runCacheSize)"
        )

    def put(self, path: str, entry: dict[str, Any], local: str) -> bool:
        """Moves `local`, the bytes just stored at remote `path` (its entry:
        ``bytes`` and ``crc32c``), into the cache (a copy where `local` is on
        another filesystem), so this machine's next read of it finds it
        there; False (`local` left alone) for a file larger than the whole
        cache."""
        if int(entry["bytes"]) > self.max_bytes:
            return False
        cached = self.directory / self._name(path, entry)
        try:
            os.replace(local, cached)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise self._unusable(path, e) from e

            def copy(f: Any) -> None:
                with open(local, "rb") as src:
                    shutil.copyfileobj(src, f)

            self._place(path, cached, copy)
        self._evict(keep=cached)
        return True

    def put_bytes(self, path: str, entry: dict[str, Any], data: bytes | pa.Buffer) -> bool:
        """As :meth:`put`, the file's bytes in hand."""
        if int(entry["bytes"]) > self.max_bytes:
            return False
        cached = self.directory / self._name(path, entry)
        self._place(path, cached, lambda f: f.write(data))
        self._evict(keep=cached)
        return True

    def _place(self, path: str, cached: Path, write: Callable[[Any], object]) -> None:
        """`cached` written by `write` into a temporary file, renamed into place."""
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                write(f)
            os.replace(tmp, cached)
        except OSError as e:
            _unlink(tmp)
            raise self._unusable(path, e) from e

    def _name(self, path: str, entry: dict[str, Any]) -> str:
        digest = hashlib.sha256(path.encode()).hexdigest()[:32]
        return f"{digest}-{int(entry['bytes'])}-{int(entry['crc32c'])}{_SUFFIX}"

    def _open_cached(
        self, local: Path, entry: dict[str, Any], checkpoint_id: int, path: str
    ) -> MappedRead | None:
        data = self._map(local, path)
        if data is None:
            return None
        try:
            checked(data, lambda view: fmt.check_file(view, entry, checkpoint_id, path))
        except SnapshotError:
            # A damaged local copy is not committed data: fetched again.
            _unlink(local)
            with self._lock:
                self.stats.refetched += 1
            return None
        # Its last use, for the eviction order (if evicted meanwhile, the
        # mapping still reads it).
        with contextlib.suppress(OSError):
            os.utime(local)
        return data

    def _download(self, fs: Any, path: str, local: Path, checkpoint_id: int) -> None:
        """Copies the remote file into the cache: a temporary file, renamed
        into place once whole. The store's errors and the local disk's are
        told apart: a missing remote file is the format's error, another
        remote failure a storage error naming the store, and a cache
        directory that cannot take the file a storage error naming it."""
        try:
            src = fs.open_input_file(path)
        except OSError as e:
            if isinstance(e, FileNotFoundError) or not _fs.exists(fs, path):
                raise fmt.missing_file(checkpoint_id, path) from None
            raise _fs.storage_error(e, fs, f"fetching {path} into the run cache", path) from e
        tmp = local.with_name(f".{local.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        with src:
            try:
                with open(tmp, "wb") as dst:
                    while chunk := _read(src, fs, path):
                        dst.write(chunk)
                os.replace(tmp, local)
            except OSError as e:
                _unlink(tmp)
                raise self._unusable(path, e) from e
            except BaseException:
                _unlink(tmp)
                raise

    def _unusable(self, path: str, e: OSError) -> StorageError:
        return StorageError(
            f"run cache directory {self.directory} cannot take {path} ({e.strerror or e}): "
            "free space there, give the cache another directory "
            "(spark.snapcut.state.runCacheDir), or turn it off "
            "(spark.snapcut.state.runCacheSize=0)"
        )

    def _map(self, local: Path, path: str) -> MappedRead | None:
        """The cached copy of remote file `path`, mapped; None if there is none."""
        try:
            return map_file(str(local))
        except FileNotFoundError:
            return None
        except OSError as e:
            raise self._unusable(path, e) from e

    def _evict(self, keep: Path) -> None:
        """Deletes the least recently used files until the rest fit."""
        files: list[tuple[float, int, Path]] = []
        now = time.time()
        with os.scandir(self.directory) as entries:
            for e in entries:
                try:
                    st = e.stat()
                except OSError:
                    continue  # gone meanwhile
                if e.name.endswith(".tmp"):
                    if now - st.st_mtime > _STALE_TMP_S:
                        _unlink(Path(e.path))
                    continue
                if e.name.endswith(_SUFFIX) and not e.name.startswith("."):
                    files.append((st.st_mtime, st.st_size, Path(e.path)))
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.max_bytes:
                break
            if p == keep:
                continue
            if _unlink(p):
                with self._lock:
                    self.stats.evicted += 1
            total -= size

    def used_bytes(self) -> int:
        """Bytes of the cached files now (for tests and reports)."""
        return sum(
            p.stat().st_size
            for p in self.directory.iterdir()
            if p.name.endswith(_SUFFIX) and not p.name.startswith(".")
        )


_SHARED: dict[tuple[str, int], RunCache] = {}
_SHARED_LOCK = threading.Lock()


def shared(spec: RunCacheSpec) -> RunCache | None:
    """This process's cache for `spec` (one per directory and limit, so its
    stats add up across the roots and tables that use it); None if `spec`
    turns the cache off."""
    if not spec.enabled:
        return None
    directory = spec.directory if spec.directory is not None else default_directory()
    key = (os.path.abspath(directory), spec.max_bytes)
    with _SHARED_LOCK:
        cache = _SHARED.get(key)
        if cache is None:
            cache = RunCache(Path(key[0]), spec.max_bytes)
            _SHARED[key] = cache
        return cache


def _read(src: Any, fs: Any, path: str) -> bytes:
    """The next chunk of a remote file; a failure is the store's, named."""
    try:
        chunk: bytes = src.read(_CHUNK)
    except OSError as e:
        raise _fs.storage_error(e, fs, f"fetching {path} into the run cache", path) from e
    return chunk


def _unlink(p: Path) -> bool:
    """Removes `p` if it can (best effort: a file another process removed,
    or a directory gone from under it, is not an error); whether it did."""
    try:
        p.unlink()
    except OSError:
        return False
    return True
