"""The run cache (issue 37): a remote root's state files downloaded once into
a local directory, checked, mapped, and kept to a size limit, least recently
used first. On a real S3 server (moto on 127.0.0.1) against the same root's
files read with no cache."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from tests.s3_support import S3Server

from conftest import Root
from snapcut import ConfigError, SnapshotError, StorageError
from snapcut.snapshots import checkpoint_dir_name
from snapcut.snapshots.backend import FsBackend
from snapcut.snapshots.run_cache import (
    DEFAULT_RUN_CACHE_BYTES,
    RunCache,
    RunCacheSpec,
    default_directory,
    shared,
)

TASKS = [("agg", 0), ("agg", 1)]


def chains(
    backend: FsBackend, mapped: bool
) -> dict[tuple[int, Any], list[tuple[int, str, pa.Table]]]:
    out = {}
    for cid in backend.complete():
        for task in TASKS:
            chain = backend.chain(cid, task, mapped=mapped)
            assert chain is not None
            out[(cid, task)] = chain
    return out


def cache_files(directory: Path) -> list[Path]:
    return sorted(
        p for p in directory.iterdir() if p.suffix == ".arrow" and not p.name.startswith(".")
    )


@pytest.fixture
def remote(s3: S3Server, local_root: Root) -> tuple[Any, str]:
    return s3.filesystem(), s3.upload(local_root.path)


def test_a_remote_chain_read_through_the_cache_equals_one_read_without(
    remote: tuple[Any, str], tmp_path: Path
) -> None:
    fs, path = remote
    want = chains(FsBackend(fs, path), mapped=False)
    cache = RunCache(tmp_path / "cache", 1 << 30)
    backend = FsBackend(fs, path, run_cache=cache)
    assert backend.mappable
    got = chains(backend, mapped=True)
    assert got.keys() == want.keys()
    for k in want:
        assert [
            (c, kind, t.equals(w)) for (c, kind, t), (_, _, w) in zip(got[k], want[k], strict=True)
        ] == [(c, kind, True) for c, kind, _ in want[k]]
    files = cache_files(tmp_path / "cache")
    # Each distinct file once, though chains share their fulls and diffs.
    assert cache.stats.misses == len(files) > 2
    assert cache.stats.bytes_fetched == sum(f.stat().st_size for f in files) == cache.used_bytes()
    assert cache.stats.hits > 0 and cache.stats.evicted == 0
    misses = cache.stats.misses
    # A second reader (another task of the worker) finds every file cached.
    again = chains(FsBackend(fs, path, run_cache=cache), mapped=True)
    assert cache.stats.misses == misses
    assert all(
        t.equals(w) for k in want for (_, _, t), (_, _, w) in zip(again[k], want[k], strict=True)
    )


def test_the_cache_keeps_to_its_limit_least_recently_used_first(
    remote: tuple[Any, str], tmp_path: Path
) -> None:
    fs, path = remote
    backend = FsBackend(fs, path)
    cid = max(backend.complete())
    files = _chain_entries(backend, cid, TASKS[0]) + _chain_entries(backend, cid, TASKS[1])
    (ca, a), (cb, b), (cc, c) = files[:3]
    where = {
        id(e): (f"{path}/{checkpoint_dir_name(at)}/{e['path']}", at)
        for at, e in ((ca, a), (cb, b), (cc, c))
    }
    limit = sum(int(e["bytes"]) for e in (a, b, c)) - 1  # one of the three must go
    cache = RunCache(tmp_path / "cache", limit)

    def fetch(e: dict[str, Any]) -> pa.Buffer:
        remote_file, at = where[id(e)]
        read = cache.fetch(fs, remote_file, e, at)
        assert read is not None and read.pages is not None  # mapped
        time.sleep(0.02)  # distinct use times
        return read.buffer

    held = fetch(a)
    fetch(b)
    fetch(a)  # a used after b: b is the least recently used
    assert (cache.stats.misses, cache.stats.hits) == (2, 1)
    fetch(c)
    assert cache.stats.evicted == 1
    assert cache.used_bytes() == int(a["bytes"]) + int(c["bytes"]) <= limit
    fetch(a)
    assert cache.stats.misses == 3  # a stayed; b went
    fetch(b)
    assert cache.stats.misses == 4
    # A mapping of a file evicted since still reads its bytes.
    assert bytes(held) == bytes(fetch(a))


def _chain_entries(
    backend: FsBackend, cid: int, task: tuple[str, int]
) -> list[tuple[int, dict[str, Any]]]:
    """(checkpoint id, manifest entry) of each file of a task's chain."""
    from snapcut._core import format as fmt

    raw = backend.manifest_bytes(cid)
    links = fmt.state_chain(cid, raw, task[0], task[1], backend.manifest_bytes)
    assert links is not None
    return [(at, entry) for at, _, entry, _, _ in links]


def test_a_damaged_cached_copy_is_fetched_again(remote: tuple[Any, str], tmp_path: Path) -> None:
    fs, path = remote
    cache = RunCache(tmp_path / "cache", 1 << 30)
    backend = FsBackend(fs, path, run_cache=cache)
    cid = max(backend.complete())
    want = backend.chain(cid, TASKS[1], mapped=False)
    backend.chain(cid, TASKS[1], mapped=True)
    victim = cache_files(tmp_path / "cache")[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    os.unlink(victim)  # a new inode: the mappings above keep the good bytes
    victim.write_bytes(bytes(data))
    for task in TASKS:
        backend.chain(cid, task, mapped=True)
    got = backend.chain(cid, TASKS[1], mapped=True)
    assert cache.stats.refetched == 1
    assert got is not None and want is not None
    assert all(t.equals(w) for (_, _, t), (_, _, w) in zip(got, want, strict=True))


def test_a_damaged_remote_file_is_refused_and_not_kept(
    s3: S3Server, local_root: Root, tmp_path: Path
) -> None:
    fs = s3.filesystem()
    path = s3.upload(local_root.path)
    backend = FsBackend(fs, path)
    cid = max(backend.complete())
    at, entry = _chain_entries(backend, cid, TASKS[0])[-1]
    remote_file = f"{path}/{checkpoint_dir_name(at)}/{entry['path']}"
    with fs.open_input_stream(remote_file) as f:
        data = bytearray(f.read())
    data[len(data) // 3] ^= 0x01
    with fs.open_output_stream(remote_file) as f:
        f.write(bytes(data))
    cache = RunCache(tmp_path / "cache", 1 << 30)
    with pytest.raises(SnapshotError, match="fails its checksum") as e:
        FsBackend(fs, path, run_cache=cache).chain(cid, TASKS[0], mapped=True)
    assert entry["path"] in str(e.value)
    # The damaged download is not kept (nor its temporary file).
    left = [p.name for p in (tmp_path / "cache").iterdir()]
    assert all(p.endswith(".arrow") and not p.startswith(".") for p in left), left
    assert not [p for p in left if p.endswith(f"-{entry['bytes']}-{entry['crc32c']}.arrow")]


def test_a_missing_remote_file_is_named(remote: tuple[Any, str], tmp_path: Path) -> None:
    fs, path = remote
    backend = FsBackend(fs, path)
    cid = max(backend.complete())
    at, entry = _chain_entries(backend, cid, TASKS[0])[-1]
    fs.delete_file(f"{path}/{checkpoint_dir_name(at)}/{entry['path']}")
    cache = RunCache(tmp_path / "cache", 1 << 30)
    with pytest.raises(SnapshotError, match="listed in the manifest is missing") as e:
        FsBackend(fs, path, run_cache=cache).chain(cid, TASKS[0], mapped=True)
    assert entry["path"] in str(e.value)
    # The chain's other files were fetched; of the missing one, nothing (no
    # copy, no temporary file).
    left = [p.name for p in (tmp_path / "cache").iterdir()]
    assert all(p.endswith(".arrow") and not p.startswith(".") for p in left), left
    assert not [p for p in left if p.endswith(f"-{entry['bytes']}-{entry['crc32c']}.arrow")]


def test_a_file_larger_than_the_cache_is_read_as_without_one(
    remote: tuple[Any, str], tmp_path: Path
) -> None:
    fs, path = remote
    cache = RunCache(tmp_path / "cache", 1)
    backend = FsBackend(fs, path, run_cache=cache)
    cid = max(backend.complete())
    got = backend.chain(cid, TASKS[0], mapped=True)
    want = FsBackend(fs, path).chain(cid, TASKS[0], mapped=False)
    assert got is not None and want is not None
    assert all(t.equals(w) for (_, _, t), (_, _, w) in zip(got, want, strict=True))
    assert cache.stats.too_large == len(got) and cache.stats.misses == 0
    assert not list((tmp_path / "cache").iterdir())


def test_a_local_root_needs_no_cache(local_root: Root, tmp_path: Path) -> None:
    backend = FsBackend(
        pafs.LocalFileSystem(), str(local_root.path), run_cache=RunCache(tmp_path / "c", 1 << 20)
    )
    assert backend.run_cache is None and backend.mappable


def test_cache_settings_parse_and_bad_ones_are_refused(tmp_path: Path) -> None:
    assert RunCacheSpec.parse(None, None) == RunCacheSpec(None, DEFAULT_RUN_CACHE_BYTES)
    assert RunCacheSpec.parse("512MB", tmp_path) == RunCacheSpec(str(tmp_path), 512 << 20)
    assert RunCacheSpec.parse(4096, None).max_bytes == 4096
    off = RunCacheSpec.parse("0", None)
    assert not off.enabled and shared(off) is None
    for bad in ("lots", -1, "12 parsecs", 1.5, True):
        with pytest.raises(ConfigError, match="is not a size: give bytes"):
            RunCacheSpec.parse(bad, None)  # type: ignore[arg-type]
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=f"run cache directory {blocker}/c cannot be written"):
        RunCache(blocker / "c", 1 << 20)
    one = shared(RunCacheSpec(str(tmp_path / "s"), 1 << 20))
    assert one is not None and one is shared(RunCacheSpec(str(tmp_path / "s"), 1 << 20))
    assert default_directory().startswith(
        os.path.join(os.path.dirname(default_directory()), "snapcut-run-cache")
    )


def test_a_download_cut_short_leaves_nothing_that_is_read(
    remote: tuple[Any, str], tmp_path: Path
) -> None:
    """A process killed mid-download leaves a temporary file: never read as
    a copy (the file is fetched whole again), and removed once it is an hour
    old; a younger one (another process's download in flight) stays."""
    fs, path = remote
    cache_dir = tmp_path / "cache"
    cache = RunCache(cache_dir, 1 << 30)
    backend = FsBackend(fs, path, run_cache=cache)
    cid = max(backend.complete())
    want = backend.chain(cid, TASKS[0], mapped=False)
    at, entry = _chain_entries(backend, cid, TASKS[0])[-1]
    remote_file = f"{path}/{checkpoint_dir_name(at)}/{entry['path']}"
    name = cache._name(remote_file, entry)
    stale = cache_dir / f".{name}.4242.dead.tmp"
    stale.write_bytes(b"ARROW1 half a file")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    young = cache_dir / f".{name}.4243.busy.tmp"
    young.write_bytes(b"ARROW1 another half")
    got = backend.chain(cid, TASKS[0], mapped=True)
    assert got is not None and want is not None
    assert all(t.equals(w) for (_, _, t), (_, _, w) in zip(got, want, strict=True))
    assert cache.stats.misses == len(got) and cache.stats.refetched == 0
    assert not stale.exists() and young.exists()
    assert (cache_dir / name).stat().st_size == int(entry["bytes"])


def test_a_cache_directory_that_cannot_take_a_file_is_named(
    remote: tuple[Any, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory gone and a file in its place after the cache opened it:
    the download fails naming the directory and the remote file, and leaves
    nothing behind."""
    fs, path = remote
    cache_dir = tmp_path / "cache"
    cache = RunCache(cache_dir, 1 << 30)
    cache_dir.rmdir()
    cache_dir.write_text("not a directory")
    backend = FsBackend(fs, path, run_cache=cache)
    cid = max(backend.complete())
    with pytest.raises(StorageError, match=f"run cache directory {cache_dir} cannot take") as e:
        backend.chain(cid, TASKS[0], mapped=True)
    assert path in str(e.value) and "runCacheDir" in str(e.value)
    # The same for the download itself (reached when no copy is looked for).
    monkeypatch.setattr(cache, "_open_cached", lambda *_: None)
    with pytest.raises(StorageError, match=f"run cache directory {cache_dir} cannot take") as e:
        backend.chain(cid, TASKS[0], mapped=True)
    assert isinstance(e.value.__cause__, NotADirectoryError)
    assert cache.stats.misses == 0
    assert cache_dir.read_text() == "not a directory"


def test_a_writer_keeps_the_state_files_it_writes_in_the_cache(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote root's writer with a run cache keeps each state file it
    writes there (a diff from its bytes, a full from the local file it
    uploaded, copied where the cache is on another filesystem): a reader on
    the same machine finds them and fetches nothing. A file larger than the
    whole cache is not kept."""
    from snapcut.snapshots import SnapshotWriter

    fs, path = s3.filesystem(), f"{s3.bucket()}/root"
    spec = RunCacheSpec(str(tmp_path / "cache"), 1 << 30)
    writer = SnapshotWriter(path, filesystem=fs, run_cache=spec)
    from snapcut.snapshots.layout import TIME_METADATA

    full = pa.table({"k": pa.array(range(1000), pa.int64()), "v": pa.array(range(1000))})
    # A full indexed by time is written through a local file (its index read
    # back from it), and that file is on "another filesystem": it is copied.
    full = full.replace_schema_metadata({TIME_METADATA: "v"})
    real_replace = os.replace
    crossed = []

    def no_rename_from_tmp(src: Any, dst: Any) -> None:
        if not str(src).startswith(str(tmp_path / "cache")):
            crossed.append(src)
            raise OSError(18, "Invalid cross-device link")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", no_rename_from_tmp)
    e0 = writer.write_state(0, "agg", 0, full, key="k", base_runs=[])
    monkeypatch.setattr(os, "replace", real_replace)
    assert crossed
    diff = full.slice(0, 10).append_column("__deleted", pa.array([False] * 10))
    e1 = writer.write_state(1, "agg", 0, diff, key="k", kind="diff", base_runs=e0["runs"])
    writer.commit(0, [e0], tasks=[("agg", 0)])
    writer.commit(1, [e1], tasks=[("agg", 0)])
    cache = shared(spec)
    assert cache is not None
    assert len(cache_files(tmp_path / "cache")) == 2
    backend = FsBackend(fs, path, run_cache=cache)
    before = cache.stats.copy()
    chain = backend.chain(1, ("agg", 0), mapped=True)
    assert chain is not None and [kind for _, kind, _ in chain] == ["full", "diff"]
    assert cache.stats.misses == before.misses and cache.stats.hits == before.hits + 2
    # Too large for the whole cache: not kept (the upload is all that counts).
    small = RunCacheSpec(str(tmp_path / "small"), 64)
    tiny = SnapshotWriter(f"{path}-2", filesystem=fs, run_cache=small)
    tiny.write_state(0, "agg", 0, full, key="k", base_runs=[])
    assert cache_files(tmp_path / "small") == []


def test_a_linked_copy_outlives_its_eviction(remote: tuple[Any, str], tmp_path: Path) -> None:
    """`link` gives a reader (a remote root's compactor) a hard link of the
    cached copy: the cache may evict its own name meanwhile."""
    fs, path = remote
    backend = FsBackend(fs, path)
    cid = backend.complete()[-1]
    (entry,) = [
        f for f in backend.manifest(cid)["files"] if f["role"] == "state" and f["subtask"] == 0
    ]
    cache = RunCache(tmp_path / "cache", 1 << 30)
    remote_file = f"{path}/{checkpoint_dir_name(cid)}/{entry['path']}"
    dst = tmp_path / "linked.arrow"
    cache.link(fs, remote_file, entry, cid, str(dst))
    (cached,) = cache_files(tmp_path / "cache")
    assert dst.stat().st_ino == cached.stat().st_ino
    cached.unlink()
    assert dst.read_bytes() == backend.read_checked(cid, entry)
