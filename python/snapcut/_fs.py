"""Filesystem plumbing for snapshot roots named by URI (pyarrow.fs).

A root is a local path (handled by the Rust store) or any URI pyarrow's
filesystems accept (s3://, gs://, hdfs://, file://), or an explicit
``pyarrow.fs.FileSystem`` plus a path inside it.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow.fs as pafs

from snapcut._core import StorageError


def is_uri(root: object) -> bool:
    return isinstance(root, str) and "://" in root


def resolve(root: str | os.PathLike[str], filesystem: Any = None) -> tuple[Any, str]:
    """The filesystem and the root path inside it."""
    if filesystem is not None:
        return filesystem, str(root).rstrip("/")
    if is_uri(root):
        try:
            fs, path = pafs.FileSystem.from_uri(str(root))
        except Exception as e:  # pyarrow raises ArrowInvalid / OSError variants
            raise StorageError(f"cannot open snapshot root {root!s}: {e}") from e
        return fs, str(path).rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(os.fspath(root))


def local_path(fs: Any, path: str) -> str | None:
    """The OS path behind `path` if `fs` is local (directly or as a sub-tree)."""
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    if isinstance(fs, pafs.SubTreeFileSystem):
        inner = local_path(fs.base_fs, fs.base_path.rstrip("/"))
        if inner is not None:
            return os.path.join(inner, path.lstrip("/"))
    return None


def exists(fs: Any, path: str) -> bool:
    return bool(fs.get_file_info(path).type != pafs.FileType.NotFound)


def read_bytes(fs: Any, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        data: bytes = f.read()
    return data


def write_bytes(fs: Any, path: str, data: bytes) -> None:
    """Writes a whole file; on a local filesystem also fsyncs it."""
    local = local_path(fs, path)
    try:
        if local is not None:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(local, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as out:
            out.write(data)
    except OSError as e:
        raise StorageError(f"writing {path}: {e}") from e


def write_atomic(fs: Any, path: str, tmp_path: str, data: bytes) -> None:
    """Writes `path` so that a reader sees no file or the whole file.

    Locally: temp file + fsync + rename + directory fsync. On object stores a
    single PUT is already all-or-nothing, so the file is written directly.
    """
    local = local_path(fs, path)
    if local is None:
        write_bytes(fs, path, data)
        return
    local_tmp = local_path(fs, tmp_path)
    assert local_tmp is not None
    write_bytes(fs, tmp_path, data)
    try:
        os.replace(local_tmp, local)
        fd = os.open(os.path.dirname(local), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise StorageError(f"renaming into {path}: {e}") from e
