"""A remote root's (an object store's) runs merged off the task's path
(issue 37), as :mod:`~snapcut.spark.state.compaction` merges a local root's.

An object store has no hard links, and a copy into the adopting batch's
directory would cost the commit O(state) again. So a merge is stored where
a later commit can name it as it is: in the directory of the newest
checkpoint it merged (``chk-N/``, its run file and what is stored beside
it), with a record naming what it merged under
``<root>/compacting/<vertex>-<partition>/<run file>.json``, written last.
A commit of batch M adopts it by naming it there (a run's directory need
not be its adopter's) while ``chk-N/`` is kept whole: N > M - `retain`
(retention keeps the newest `retain` checkpoints whole, and after M's
manifest names the run, keeps the file as long as M needs it). A merge
no commit adopted in time stays unnamed in ``chk-N/`` until retention
removes that directory; its record is removed by the next commit that finds
it of no use (the file itself never: a commit may name it).

The merge reads its inputs locally: a fetch thread links each into this
worker's own directory under the run cache (``<cache>/compacting/
_worker-<host>-<pid>-<id>/chk-N/``), from the run cache (downloaded first
where it is not there yet), and only then hands the merge to the Rust
compactor, so the task never waits for a download. The output, once
uploaded, moves into the run cache: this host's next cold load of the
partition finds it there. The upload waits between its parts while a task
of the process commits (:func:`~snapcut.spark.state.compaction.committing`),
so the commit does not share the store's bandwidth with it.

One worker merges a partition at a time, by a claim under its directory as
for a local root, best effort: an object store has no exclusive create, so
two workers may both take a partition's claim at the same moment and both
merge it. Their outputs are the same runs merged by the same rule, and the
second is of no use once the first is adopted: work lost, nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from snapcut import _fs
from snapcut._core import SnapcutError
from snapcut.snapshots import checkpoint_dir_name, file_component
from snapcut.snapshots.run_cache import RunCache
from snapcut.snapshots.runs import adopt_run, compaction_inputs
from snapcut.snapshots.runs import adoptable as runs_adoptable
from snapcut.spark.state.compaction import (
    CLAIM_FILE,
    COMPACTING_DIR,
    PUBLISH_POLL_S,
    PUBLISHED_SUFFIX,
    WorkerCompactor,
    claim_stale,
    remove_dead_workers,
    worker_dir,
    yield_to_commits,
)

__all__ = ["MIN_RETAIN", "RemoteCompactor", "StoredMerge"]

#: The least `retain` a remote root's merges need: a merge is adopted by a
#: batch or two after the newest checkpoint it merged, while that
#: checkpoint is kept whole. Below it, commits write fulls themselves.
MIN_RETAIN = 3

#: Merges waiting for their inputs to be fetched, at most (more are not
#: taken: their partitions merge after a later commit).
FETCH_QUEUE = 64


@dataclass(frozen=True)
class StoredMerge:
    """A merged run stored in ``chk-<at>/``, waiting for a commit to name it."""

    name: str
    at: int
    inputs: list[dict[str, Any]]
    output: dict[str, Any]


@dataclass(frozen=True)
class _Job:
    vertex: str
    partition: int
    key: str
    runs: list[dict[str, Any]]
    limit: int
    inputs: list[tuple[int, dict[str, Any]]]


class RemoteCompactor(WorkerCompactor):
    """One worker's compactor of one remote root: inputs fetched on a thread
    of its own, merged on the Rust thread, stored and recorded on the
    publisher thread."""

    looks_every_commit = False

    def __init__(
        self,
        fs: Any,
        path: str,
        cache: RunCache,
        cpu_share: float = 1.0,
        bytes_per_s: int | None = None,
    ) -> None:
        self.fs = fs
        self.root = path
        self.cache = cache
        self.host = socket.gethostname()
        base = os.path.join(str(cache.directory), COMPACTING_DIR)
        os.makedirs(base, exist_ok=True)
        remove_dead_workers(base, self.host)
        self.inputs_root = worker_dir(base, self.host)
        self._jobs: queue.Queue[_Job] = queue.Queue(maxsize=FETCH_QUEUE)
        self._pending = 0
        self._lock = threading.Lock()
        self._links: dict[tuple[str, int], list[str]] = {}
        self.fetch_failures = 0
        """Merges given up before they started (an input gone, a fetch that failed)."""
        self._start(
            self.inputs_root, os.path.join(self.inputs_root, "staged"), cpu_share, bytes_per_s
        )
        self._fetcher = threading.Thread(
            target=self._fetch_loop, name="snapcut-spark-compactor-fetch", daemon=True
        )
        self._fetcher.start()

    # -- the task's side ------------------------------------------------------

    def submit(
        self,
        vertex: str,
        partition: int,
        key: str,
        runs: list[dict[str, Any]],
        limit: int,
        batch: int,
    ) -> bool:
        """Hands the merge `runs` call for to the fetch thread (its inputs
        fetched, then merged; batch `batch`'s commit), unless another worker
        holds the partition's claim; never waits for a download or the merge."""
        inputs = compaction_inputs(vertex, partition, runs, limit)
        if inputs is None or not self._claim(vertex, partition):
            return False
        self._hand_over(vertex, partition, batch)
        with self._lock:
            self._pending += 1
        try:
            self._jobs.put_nowait(_Job(vertex, partition, key, runs, limit, inputs))
        except queue.Full:
            with self._lock:
                self._pending -= 1
            self._release(vertex, partition)
            return False
        return True

    def adopt(
        self,
        batch: int,
        vertex: str,
        partition: int,
        entry: dict[str, Any],
        retain: int,
        before_link: Callable[[], None] = lambda: None,
    ) -> tuple[dict[str, Any], int]:
        """`entry` (the partition's entry of `batch`) with every stored merge
        it can adopt named where it is stored; the records of those it
        cannot (adopted before, superseded, or stored in a checkpoint that
        may no longer be kept whole) are removed. `before_link` is called
        once, before the first adoption (a crash point)."""
        adopted = 0
        called = False
        for item in self.stored(vertex, partition):
            new = None
            if _kept_whole(item, batch, retain):
                new = adopt_run(entry, item.inputs, item.output, item.at)
            if new is None:
                self._discard(vertex, partition, item)
                continue
            if not called:
                called = True
                before_link()
            entry = new
            adopted += 1
        return entry, adopted

    def adoptable(
        self, batch: int, vertex: str, partition: int, runs: list[dict[str, Any]], retain: int
    ) -> bool:
        return any(
            _kept_whole(item, batch, retain) and runs_adoptable(runs, item.inputs, item.output)
            for item in self.stored(vertex, partition)
        )

    def stored(self, vertex: str, partition: int) -> list[StoredMerge]:
        """The partition's stored merges with a record, oldest span first."""
        d = self._dir(vertex, partition)
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(d, allow_not_found=True))
        except OSError as e:
            raise _fs.storage_error(e, self.fs, f"listing {d}", d) from e
        out = []
        for info in infos:
            n = info.base_name
            if n == CLAIM_FILE or not n.endswith(PUBLISHED_SUFFIX):
                continue
            try:
                record = json.loads(_fs.read_bytes(self.fs, info.path))
            except FileNotFoundError:
                continue  # its record removed by another commit meanwhile
            except OSError as e:
                raise _fs.storage_error(e, self.fs, f"reading {info.path}", info.path) from e
            name = n[: -len(PUBLISHED_SUFFIX)]
            out.append(StoredMerge(name, int(record["at"]), record["inputs"], record["output"]))
        # Those ending at the same checkpoint: the widest first.
        out.sort(key=lambda m: (m.output["merges"][-1], m.output["merges"][0]))
        return out

    def flush(self, timeout_s: float) -> bool:
        """As :meth:`WorkerCompactor.flush`, the fetches handed over first."""
        deadline = time.monotonic() + timeout_s
        while self._pending > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return super().flush(max(0.0, deadline - time.monotonic()))

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "fetch_failures": self.fetch_failures}

    def close(self) -> None:
        self._closed.set()
        self._fetcher.join(PUBLISH_POLL_S * 4)
        super().close()

    @property
    def own_dir(self) -> str:
        """Its inputs' links and its staging directory."""
        return self.inputs_root

    # -- claims and records ---------------------------------------------------

    def _dir(self, vertex: str, partition: int) -> str:
        return f"{self.root}/{COMPACTING_DIR}/{file_component(vertex)}-{partition}"

    def _claim(self, vertex: str, partition: int) -> bool:
        path = f"{self._dir(vertex, partition)}/{CLAIM_FILE}"
        try:
            info = self.fs.get_file_info(path)
            if info.type != pafs.FileType.NotFound:
                age = 0.0 if info.mtime is None else time.time() - info.mtime.timestamp()
                try:
                    holder = json.loads(_fs.read_bytes(self.fs, path))
                except FileNotFoundError:
                    holder = None  # released meanwhile
                except ValueError:
                    holder = {}
                if holder is not None and not claim_stale(holder, age, self.host):
                    return False
            claim = {"host": self.host, "pid": os.getpid(), "at_ms": int(time.time() * 1000)}
            _fs.write_bytes(self.fs, path, json.dumps(claim).encode())
            self._claims.add((vertex, partition))
            return True
        except (OSError, SnapcutError):
            return False  # the store refused: no merge this time

    def _release(self, vertex: str, partition: int) -> None:
        self._forget(vertex, partition)
        with contextlib.suppress(OSError):
            self.fs.delete_file(f"{self._dir(vertex, partition)}/{CLAIM_FILE}")
        for link in self._links.pop((vertex, partition), []):
            with contextlib.suppress(FileNotFoundError):
                os.remove(link)

    def _discard(self, vertex: str, partition: int, item: StoredMerge) -> None:
        """Removes a merge's record (never its file: a commit may name it)."""
        # Best effort: a record left is found of no use again by the next commit.
        with contextlib.suppress(OSError):
            self.fs.delete_file(f"{self._dir(vertex, partition)}/{item.name}{PUBLISHED_SUFFIX}")

    # -- the threads ----------------------------------------------------------

    def _fetch_loop(self) -> None:
        while not self._closed.is_set():
            try:
                job = self._jobs.get(timeout=PUBLISH_POLL_S)
            except queue.Empty:
                continue
            try:
                self._fetch_and_submit(job)
            except Exception:
                # An input retention removed (a full superseded it), a store
                # or disk that failed: the partition merges after a later commit.
                self.fetch_failures += 1
                self._release(job.vertex, job.partition)
            finally:
                with self._lock:
                    self._pending -= 1

    def _fetch_and_submit(self, job: _Job) -> None:
        links = self._links.setdefault((job.vertex, job.partition), [])
        for cid, entry in job.inputs:
            chk = checkpoint_dir_name(cid)
            d = os.path.join(self.inputs_root, chk)
            os.makedirs(d, exist_ok=True)
            local = os.path.join(d, entry["path"])
            self.cache.link(self.fs, f"{self.root}/{chk}/{entry['path']}", entry, cid, local)
            links.append(local)
        if not self.rc.submit(job.vertex, job.partition, job.key, job.runs, job.limit):
            self._release(job.vertex, job.partition)

    def _publish_one(self, done: dict[str, Any]) -> None:
        vertex, partition = done["vertex"], int(done["subtask"])
        staged = [p for p in (done["staged_filter"], done["staged_times"]) if p is not None]
        try:
            at = max(int(r["checkpoint"]) for r in done["inputs"])
            chk = f"{self.root}/{checkpoint_dir_name(at)}"
            name = os.path.basename(done["staged"])
            newest = next(r for r in done["inputs"] if int(r["checkpoint"]) == at)
            if not _fs.exists(self.fs, f"{chk}/{newest['path']}"):
                return  # retention removed that checkpoint: nothing could adopt it
            # Another worker's twin of this merge (the claims are best effort)
            # may be there, named by a commit already: never overwritten.
            if not _fs.exists(self.fs, f"{chk}/{name}"):
                # What is stored beside the run file first: a run file in
                # place names it.
                for p in staged:
                    _fs.upload(self.fs, p, f"{chk}/{os.path.basename(p)}", yield_to_commits)
                _fs.upload(self.fs, done["staged"], f"{chk}/{name}", yield_to_commits)
            record = {
                "kind": done["kind"],
                "at": at,
                "inputs": done["inputs"],
                "output": done["output"],
            }
            path = f"{self._dir(vertex, partition)}/{name}{PUBLISHED_SUFFIX}"
            _fs.write_bytes(self.fs, path, json.dumps(record).encode())
            self.cache.put(f"{chk}/{name}", done["output"], done["staged"])
            self.published += 1
        finally:
            for p in (*staged, done["staged"]):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(p)
            self._release(vertex, partition)


def _kept_whole(item: StoredMerge, batch: int, retain: int) -> bool:
    """Whether `item`'s checkpoint is among those retention keeps whole
    until `batch` commits (its file there for certain)."""
    return batch - item.at < retain
