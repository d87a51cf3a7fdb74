"""A Spark state root's runs merged off the task's path (issue 37).

A task's commit writes what its batch changed (a diff), as Spark's own
state store providers write a delta or a changelog in their commit; their
snapshots come from the executor's maintenance thread. Here each Python
worker keeps one compactor per local root (:class:`WorkerCompactor`: the
store's Rust compactor thread, paced by a CPU share and a byte rate). After
a commit whose state has `full_every` diffs on its full, the task hands the
merge its runs call for (a tier merge of the newest diffs, or a base merge
into a new full) to it and returns. Whatever finished is published under
``<root>/compacting/<vertex>-<partition>/``: the run file (and a merged
diff's filter), then ``<run file>.json`` naming what it merged, written
last. A later commit of that partition, by any worker, adopts it: a hard
link into its batch's directory and its entry's runs in place of the ones
merged (:func:`adopt`). Nothing else changes: every reader walks the runs.

A partition is merged by one worker at a time: ``claim.json`` (created
exclusively) names the worker's host and process, and holds until its
merge is published, or its process is found gone (on the same host), or
for at most :data:`CLAIM_TIMEOUT_S` (a worker on another host that died
while merging). A compactor's
own staging directory ``_worker-<host>-<pid>-<id>`` is removed when the
next compactor on that host finds its process gone.

Retention needs no record of the merges in flight: their inputs are the
runs of the newest version, which retention keeps until a full supersedes
them. A merge maps its inputs as it starts (a mapping outlives an unlink);
one whose input is already gone fails with no output and gives its
partition's claim back, and an output whose inputs were superseded is
removed by the next commit that finds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from snapcut import _fs
from snapcut.snapshots import checkpoint_dir_name, file_component
from snapcut.snapshots.runs import RunCompactor, adopt_run
from snapcut.snapshots.runs import adoptable as runs_adoptable
from snapcut.spark import failpoints

__all__ = [
    "CLAIM_TIMEOUT_S",
    "COMPACTING_DIR",
    "Published",
    "WorkerCompactor",
    "adopt",
    "published",
]

COMPACTING_DIR = "compacting"
WORKER_PREFIX = "_worker-"
CLAIM_FILE = "claim.json"
PUBLISHED_SUFFIX = ".json"

#: How long a claim keeps other workers from merging a partition: longer
#: than a paced merge of a large partition takes, short enough that a
#: worker's death mid-merge costs a few batches of longer chains (a
#: commit writes a full itself once they reach twice `full_every`).
CLAIM_TIMEOUT_S = 600.0

#: How long a publisher waits for finished merges per round (a close waits
#: at most this plus the compactor's own shutdown, 10 s): short, so a
#: closing worker is not held up; a round that finds nothing costs a wakeup.
PUBLISH_POLL_S = 0.1


#: How long a compactor's upload yields to one commit of its process, at most.
YIELD_MAX_S = 30.0

_FOREGROUND = threading.Condition()
_COMMITTING = 0


@contextlib.contextmanager
def committing() -> Iterator[None]:
    """A task's commit in progress in this process: the compactors' uploads
    (a remote root's merged runs) wait between their parts until it ends,
    so a commit does not share the store's bandwidth with a merge."""
    global _COMMITTING
    with _FOREGROUND:
        _COMMITTING += 1
    try:
        yield
    finally:
        with _FOREGROUND:
            _COMMITTING -= 1
            _FOREGROUND.notify_all()


def yield_to_commits(timeout_s: float = YIELD_MAX_S) -> bool:
    """Waits until no commit of this process is in progress, at most
    `timeout_s`; False if one still is."""
    with _FOREGROUND:
        return _FOREGROUND.wait_for(lambda: _COMMITTING == 0, timeout_s)


@dataclass(frozen=True)
class Published:
    """A merged run waiting in a partition's directory under ``compacting/``."""

    name: str
    """The run file's name there, and in the directory that adopts it."""
    inputs: list[dict[str, Any]]
    output: dict[str, Any]

    @property
    def beside(self) -> list[str]:
        """What is stored beside the run file: a merged diff's filter, a
        merged full's time index (placed before it: a run file in place
        names them)."""
        return [
            self.output[k]["path"] for k in ("filter", "times") if self.output.get(k) is not None
        ]


def partition_dir(root: str, vertex: str, partition: int) -> str:
    return os.path.join(root, COMPACTING_DIR, f"{file_component(vertex)}-{partition}")


def published(root: str, vertex: str, partition: int) -> list[Published]:
    """The merged runs of a partition waiting for adoption, oldest span first."""
    d = partition_dir(root, vertex, partition)
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(PUBLISHED_SUFFIX))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise _fs.storage_error(e, None, f"listing {d}", d) from e
    out = []
    for n in names:
        if n == CLAIM_FILE:
            continue
        try:
            with open(os.path.join(d, n), encoding="utf-8") as f:
                record = json.load(f)
        except FileNotFoundError:
            continue  # adopted and removed by another commit meanwhile
        out.append(Published(n[: -len(PUBLISHED_SUFFIX)], record["inputs"], record["output"]))
    # Those ending at the same checkpoint: the widest first (a base merge
    # before a tier merge of its newest diffs).
    out.sort(key=lambda p: (p.output["merges"][-1], p.output["merges"][0]))
    return out


def discard(root: str, vertex: str, partition: int, item: Published) -> None:
    """Removes a published run nothing can adopt any more (its record first)."""
    d = partition_dir(root, vertex, partition)
    for name in (item.name + PUBLISHED_SUFFIX, item.name, *item.beside):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(d, name))


def adopt(
    root: str,
    batch: int,
    vertex: str,
    partition: int,
    entry: dict[str, Any],
    before_link: Callable[[], None] = lambda: None,
) -> tuple[dict[str, Any], int]:
    """`entry` (the partition's new state file entry of `batch`, listing
    runs) with every published merge it can adopt in place of the runs it
    merged, each run file linked into the batch's directory (durable before
    the entry names it); those it cannot adopt are removed (adopted before,
    or their inputs superseded: a full captured, another merge adopted).
    `before_link` is called once, before the first link (a crash point).
    Returns the entry and how many it adopted."""
    adopted = 0
    called = False
    chk = os.path.join(root, checkpoint_dir_name(batch))
    src = partition_dir(root, vertex, partition)
    for item in published(root, vertex, partition):
        new = adopt_run(entry, item.inputs, item.output, batch)
        if new is None:
            discard(root, vertex, partition, item)
            continue
        files = [*item.beside, item.name]
        if not called:
            called = True
            before_link()
        if not all(_place(os.path.join(src, n), os.path.join(chk, n)) for n in files):
            continue  # removed by a commit that adopted it (a retry's twin): not adopted here
        entry = new
        adopted += 1
    if adopted:
        _fs.fsync_dir(chk)
    return entry, adopted


def adoptable(root: str, vertex: str, partition: int, runs: list[dict[str, Any]]) -> bool:
    """Whether a published merge can be adopted on top of `runs`."""
    return any(
        runs_adoptable(runs, item.inputs, item.output)
        for item in published(root, vertex, partition)
    )


def _place(src: str, dst: str) -> bool:
    """`src` at `dst` too: a hard link (no copy), else a copy where the
    filesystem has none. False if `src` is gone."""
    try:
        os.link(src, dst)
        return True
    except FileExistsError:
        # A retry of this batch linked it before: the same merge, the same bytes.
        return os.path.getsize(src) == os.path.getsize(dst)
    except FileNotFoundError:
        return False
    except OSError:
        pass
    tmp = f"{dst}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    try:
        shutil.copyfile(src, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst)
        return True
    except FileNotFoundError:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        return False


class WorkerCompactor:
    """One worker's compactor of one local root: merges on a Rust thread,
    publishes each finished merge from a daemon thread of its own."""

    looks_every_commit = True
    """Whether every commit lists the partition's published merges (a local
    root's: it removes those adopted before, which keep disk space)."""

    def __init__(self, root: str, cpu_share: float = 1.0, bytes_per_s: int | None = None) -> None:
        self.root = root
        self.host = socket.gethostname()
        base = os.path.join(root, COMPACTING_DIR)
        os.makedirs(base, exist_ok=True)
        remove_dead_workers(base, self.host)
        staging = worker_dir(base, self.host)
        self._start(root, staging, cpu_share, bytes_per_s)

    def _start(
        self, inputs_root: str, staging: str, cpu_share: float, bytes_per_s: int | None
    ) -> None:
        """The Rust compactor (reading its inputs under `inputs_root`,
        staging its outputs in `staging`) and the publisher thread."""
        self.staging = staging
        self.rc = RunCompactor(inputs_root, staging, cpu_share, bytes_per_s)
        self._closed = threading.Event()
        self._claims: set[tuple[str, int]] = set()
        """The partitions whose claim this compactor holds (given up at close)."""
        self.published = 0
        self.publish_failures = 0
        self.handled = 0
        """Finished merges the publisher took (published, or failed to)."""
        self._handed: dict[tuple[str, int], tuple[int, int | None]] = {}
        """(vertex, partition) → the handing commit's batch and attempt (a crash point's)."""
        self._reported = {"merged": 0, "busy_s": 0.0}
        self._report_lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._publish_loop, name="snapcut-spark-compactor", daemon=True
        )
        self._thread.start()

    def submit(
        self,
        vertex: str,
        partition: int,
        key: str,
        runs: list[dict[str, Any]],
        limit: int,
        batch: int,
    ) -> bool:
        """Hands the merge `runs` call for with `limit` diffs on their full to
        the thread (batch `batch`'s commit), unless another worker holds the
        partition's claim; never waits for the merge."""
        if not self._claim(vertex, partition):
            return False
        self._hand_over(vertex, partition, batch)
        if self.rc.submit(vertex, partition, key, runs, limit):
            return True
        self._release(vertex, partition)
        return False

    def adopt(
        self,
        batch: int,
        vertex: str,
        partition: int,
        entry: dict[str, Any],
        retain: int,
        before_link: Callable[[], None] = lambda: None,
    ) -> tuple[dict[str, Any], int]:
        """:func:`adopt` on this compactor's root (a merge linked into the
        batch's directory needs no checkpoint kept: `retain` is not used)."""
        return adopt(self.root, batch, vertex, partition, entry, before_link)

    def adoptable(
        self, batch: int, vertex: str, partition: int, runs: list[dict[str, Any]], retain: int
    ) -> bool:
        """:func:`adoptable` on this compactor's root."""
        return adoptable(self.root, vertex, partition, runs)

    def _hand_over(self, vertex: str, partition: int, batch: int) -> None:
        self._handed[(vertex, partition)] = (batch, failpoints.task_attempt())

    def _before_publish(self, done: dict[str, Any]) -> None:
        """The crash point ``compaction.before_publish`` of the commit that
        handed `done` over."""
        partition = int(done["subtask"])
        handed = self._handed.pop((done["vertex"], partition), None)
        if handed is not None:
            batch, attempt = handed
            failpoints.hit_off_task("compaction.before_publish", batch, partition, attempt)

    def _claim(self, vertex: str, partition: int) -> bool:
        if not _claim(partition_dir(self.root, vertex, partition), self.host):
            return False
        self._claims.add((vertex, partition))
        return True

    def _release(self, vertex: str, partition: int) -> None:
        self._forget(vertex, partition)
        _release(partition_dir(self.root, vertex, partition))

    def _forget(self, vertex: str, partition: int) -> None:
        """Drops its claim on the partition and the commit that handed its merge over."""
        self._claims.discard((vertex, partition))
        self._handed.pop((vertex, partition), None)

    def flush(self, timeout_s: float) -> bool:
        """Waits at most `timeout_s` for every merge handed over to be
        merged and published (tests, tools); False if it ran out."""
        deadline = time.monotonic() + timeout_s
        if not self.rc.wait_idle(timeout_s):
            return False
        merged = int(self.rc.stats()["merged"])
        while self.handled < merged:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def hold(self) -> Any:
        """No merge starts until the hold's ``release()`` (tests)."""
        return self.rc.hold()

    def stats(self) -> dict[str, Any]:
        return {
            **self.rc.stats(),
            "published": self.published,
            "publish_failures": self.publish_failures,
        }

    def report(self) -> dict[str, int]:
        """The merges finished (``merged``) and the time spent merging
        (``busy_ms``) since the last report: each task of the process
        reports what its worker's compactor did since the one before, so a
        step's sum counts each merge once."""
        stats = self.rc.stats()
        with self._report_lock:
            merged = int(stats["merged"]) - int(self._reported["merged"])
            busy_s = float(stats["busy_s"]) - float(self._reported["busy_s"])
            self._reported = {"merged": int(stats["merged"]), "busy_s": float(stats["busy_s"])}
        return {"merged": merged, "busy_ms": round(busy_s * 1000)}

    def close(self) -> None:
        """Stops the threads (a merge in hand abandoned), gives up the claims
        it holds and removes its own directory: an exiting worker leaves
        nothing behind for the next one to clear."""
        self._closed.set()
        self._thread.join(PUBLISH_POLL_S * 4)
        self.rc.close()
        for vertex, partition in list(self._claims):
            self._release(vertex, partition)
        shutil.rmtree(self.own_dir, ignore_errors=True)

    @property
    def own_dir(self) -> str:
        """The directory this compactor alone writes (its staging)."""
        return self.staging

    def _publish_loop(self) -> None:
        while not self._closed.is_set():
            for done in self.rc.wait_finished(PUBLISH_POLL_S):
                self._before_publish(done)
                # A publisher outlives one output it could not publish (a
                # disk or store that failed: its partition then merges again
                # after a later commit).
                try:
                    self._publish_one(done)
                except Exception:
                    self.publish_failures += 1
                self.handled += 1
            # A merge that failed (an input retention removed once a full
            # superseded it, a damaged file) gives its partition back.
            for vertex, partition in self.rc.take_dropped():
                self._release(vertex, partition)

    def _publish_one(self, done: dict[str, Any]) -> None:
        d = partition_dir(self.root, done["vertex"], int(done["subtask"]))
        try:
            name = os.path.basename(done["staged"])
            for beside in (done["staged_filter"], done["staged_times"]):
                if beside is not None:
                    os.replace(beside, os.path.join(d, os.path.basename(beside)))
            os.replace(done["staged"], os.path.join(d, name))
            record = {"kind": done["kind"], "inputs": done["inputs"], "output": done["output"]}
            path = os.path.join(d, name + PUBLISHED_SUFFIX)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fs.fsync_dir(d)
            self.published += 1
        finally:
            _release(d)


def worker_dir(base: str, host: str) -> str:
    """A new compactor's own directory under `base`, named by its host and
    process (:func:`remove_dead_workers` finds it by them)."""
    return os.path.join(base, f"{WORKER_PREFIX}{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _claim(d: str, host: str) -> bool:
    """Takes the partition's claim, or False while another worker's holds."""
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, CLAIM_FILE)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                age = time.time() - os.path.getmtime(path)
                with open(path, encoding="utf-8") as f:
                    holder = json.load(f)
            except FileNotFoundError:
                continue  # released meanwhile
            except ValueError:
                holder = {}  # being written by its worker (or cut short by its death)
            if not claim_stale(holder, age, host):
                return False
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)  # its worker died while merging
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({"host": host, "pid": os.getpid(), "at_ms": int(time.time() * 1000)}, f)
        return True
    return False


def claim_stale(holder: dict[str, Any], age_s: float, host: str) -> bool:
    """Whether a claim `age_s` old held by `holder` (its host and pid) may be
    taken over: its process gone (on this host) or the claim timed out."""
    gone = holder.get("host") == host and not _alive(int(holder.get("pid", -1)))
    return gone or age_s >= CLAIM_TIMEOUT_S


def _release(d: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(d, CLAIM_FILE))


def remove_dead_workers(base: str, host: str) -> None:
    """Removes the staging directories of this host's compactors whose
    process is gone (a worker killed mid-merge leaves its partial output)."""
    prefix = f"{WORKER_PREFIX}{host}-"
    for name in os.listdir(base):
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix) :].split("-", 1)[0]
        if not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process's id (0 and -1 would signal groups)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
