"""Crash points inside Spark tasks, for the exactly-once tests and chaos.

``SNAPCUT_SPARK_FAILPOINTS`` arms them, comma-separated, each
``point:batch:partition:action[:attempt]``::

    state.after_write:2:0:raise:0    # attempt 0 of batch 2, partition 0 raises
    state.after_ack:3:1:kill         # the Python worker SIGKILLs itself
    sink.after_commit:1:*:raise      # the driver fails after the sink committed batch 1

``raise`` fails the task (Spark retries it); ``kill`` is a SIGKILL: hit in a
task, of that Python worker only (as an external ``kill -9`` of the worker:
the JVM sees the worker crash and Spark retries the task), hit on the driver
(``sink.before_commit``, ``sink.after_commit``), of the whole driver: its
Python process, its JVM and the Python workers (:func:`snapcut._procs.kill_tree`;
under Spark Connect, the process that started the local server, with it),
as a machine failure would; ``sleep`` stalls 3 s (a straggler, for
speculation). ``*`` matches any batch or partition; the driver-side sink
points (``sink.before_commit``, ``sink.after_table_commit`` — a Delta output
only —, ``sink.after_commit``) hit with partition 0
and read the variable from the driver's own environment. The variable reaches
Python workers through ``spark.executorEnv.*``; a value ``@/path`` reads the
points from that file at every hit, so a test can re-arm a running session.

``spill.after_run`` and ``spill.merged`` are crash points in Rust (a
spilling state table's flush and merge, ``keyed_state(state_memory=)``):
a task arms them for its own state work alone (:func:`rust_points`), and a
hit SIGKILLs its Python worker (``kill`` is their only action).
``input.part_sent`` is reached only by a task whose input outgrew its share
of ``state_memory`` (applied in parts, its output already partly sent).
``compaction.before_publish`` is reached on a Python worker's compactor
thread, outside any task, when it has merged what the commit of (batch,
partition, attempt) handed over (``keyed_state(compaction=True)``, the
default): ``kill`` SIGKILLs that worker whatever it runs then, ``sleep``
stalls its publisher; ``raise`` is refused.

Every hit is announced on stderr (``snapcut: failpoint <point> hit ...``) and,
if ``SNAPCUT_SPARK_FAILPOINT_LOG`` names a file, appended to it as a JSON line
(``point``, ``batch``, ``partition``, ``action``, ``where``: "driver" or
"task", ``pid``): how the chaos harness learns which crash points fired,
executors' stderr included.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from snapcut import _core
from snapcut._core import ConfigError

ENV = "SNAPCUT_SPARK_FAILPOINTS"
LOG_ENV = "SNAPCUT_SPARK_FAILPOINT_LOG"
POINTS = {
    "state.before_write": "the batch was applied to the state, version N is not written",
    "state.after_write": "version N's state file is written, not yet acknowledged",
    "state.before_adopt": "version N's diff is written on runs a published merge can replace, "
    "the merge not yet linked into chk-N",
    "state.after_ack": "version N is acknowledged, the manifest may not be written",
    "sink.before_stage": "a sink task is about to stage its output file(s) of batch N",
    "sink.after_stage": "a sink task staged its output file(s), its result is not yet returned",
    "sink.before_commit": "driver: batch N's output is staged (and its state acked), no manifest",
    "sink.after_table_commit": "driver: batch N is in the Delta table, its manifest is not",
    "sink.after_commit": "driver: batch N's manifest is published, Spark has not committed N",
}
#: Crash points in snapcut's Rust code, reached inside a task's state work
#: when its tables spill past ``state_memory``. The task arms them for
#: itself alone (:func:`rust_points`): the environment would arm every task
#: a reused Python worker runs, its retries too. They can only ``kill``.
RUST_POINTS = {
    "spill.after_run": "a state table over its state_memory wrote a spilled run, not mapped back",
    "spill.merged": "a state table merged its spilled runs, the old ones not yet removed",
}
POINTS.update(RUST_POINTS)
#: Crash points of a task whose input outgrew its share of ``state_memory``
#: and is applied in parts (:mod:`snapcut.spark.state.key_parts`).
INPUT_POINTS = {
    "input.part_sent": "a task spilled its input by key hash and sent one part's output; "
    "the other parts are not applied, version N is not written",
}
POINTS.update(INPUT_POINTS)
#: Crash points on a Python worker's compactor thread
#: (:mod:`snapcut.spark.state.compaction`), outside any task: the batch,
#: partition and attempt are those of the commit that handed the merge over.
OFF_TASK_POINTS = {
    "compaction.before_publish": "a worker's compactor merged the runs batch N's commit handed "
    "over; the merge is staged in the worker's own directory, not yet published",
}
POINTS.update(OFF_TASK_POINTS)
ACTIONS = ("raise", "kill", "sleep")
CONNECT_WORKER_ENV = "SPARK_CONNECT_MODE_ENABLED"  # set by Connect's foreachBatch worker


class InjectedFailure(RuntimeError):
    """Raised by an armed ``raise`` crash point."""


def _armed() -> list[tuple[str, str, str, str, str | None]]:
    raw = os.environ.get(ENV, "").strip()
    if raw.startswith("@"):
        try:
            with open(raw[1:]) as f:
                raw = f.read().strip()
        except FileNotFoundError:
            return []
    out = []
    for item in filter(None, (s.strip() for s in raw.split(","))):
        parts = item.split(":")
        if len(parts) not in (4, 5) or parts[0] not in POINTS or parts[3] not in ACTIONS:
            raise ConfigError(
                f"{ENV} entry {item!r} must be point:batch:partition:action[:attempt] with a "
                f"point in {sorted(POINTS)} and an action in {ACTIONS}"
            )
        if parts[0] in OFF_TASK_POINTS and parts[3] == "raise":
            raise ConfigError(
                f"{ENV} entry {item!r}: {parts[0]} is reached on a worker's compactor "
                "thread, outside any task, where there is nothing to raise into (use "
                "kill or sleep)"
            )
        if parts[0] in RUST_POINTS and parts[3] != "kill":
            raise ConfigError(
                f"{ENV} entry {item!r}: {parts[0]} is a crash point in Rust code, which "
                "can only kill (use action kill)"
            )
        out.append((parts[0], parts[1], parts[2], parts[3], parts[4] if len(parts) == 5 else None))
    return out


def task_attempt() -> int | None:
    """The running task's attempt number; None outside a task (the driver)."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return None
    ctx = TaskContext.get()
    return ctx.attemptNumber() if ctx is not None else None


def _log_line(point: str, batch: int, partition: int, action: str, where: str) -> str:
    return json.dumps(
        {
            "point": point,
            "batch": batch,
            "partition": partition,
            "action": action,
            "where": where,
            "pid": os.getpid(),
        }
    )


def _announce(point: str, batch: int, partition: int, action: str, where: str) -> None:
    print(
        f"snapcut: failpoint {point} hit (batch {batch}, partition {partition}): {action} "
        f"({where}, pid {os.getpid()})",
        file=sys.stderr,
        flush=True,
    )
    log = os.environ.get(LOG_ENV)
    if not log:
        return
    line = _log_line(point, batch, partition, action, where)
    # One short O_APPEND write: lines of concurrent workers do not interleave.
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _kill(in_task: bool) -> None:
    """SIGKILL: the Python worker in a task, the whole driver otherwise. Under
    Spark Connect the driver-side points run in the server's foreachBatch
    worker, a child of the server's JVM, whose parent is the Python process
    that started a local server (``remote("local[N]")``): that process's
    tree is the whole driver there."""
    if not in_task:
        from snapcut import _procs as procs

        if os.environ.get(CONNECT_WORKER_ENV):
            jvm = {p.pid: p.ppid for p in procs.processes()}.get(os.getppid())
            if jvm is not None and jvm > 1:
                procs.kill_tree(jvm)
        procs.kill_tree(os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)


def _matching(
    point: str, batch: int, partition: int, attempt_of: int | None = None
) -> Iterator[tuple[str, int | None]]:
    """The actions armed for `point` at (batch, partition) and this task
    attempt (`attempt_of`: another one's), each with the attempt (None: the
    driver)."""
    for name, b, p, action, attempt in _armed():
        if name != point or b not in ("*", str(batch)) or p not in ("*", str(partition)):
            continue
        current = task_attempt() if attempt_of is None else attempt_of
        if attempt is not None and attempt != str(current or 0):
            continue
        yield action, current


@contextmanager
def rust_points(batch: int, partition: int) -> Iterator[None]:
    """Arms, while the block runs, the Rust crash points (:data:`RUST_POINTS`)
    armed for this task's (batch, partition, attempt): the Python worker
    SIGKILLs itself at the point's first hit, after the hit's line reaches
    the log as a Python point's would. Nothing is armed after the block."""
    if ENV not in os.environ:
        yield
        return
    log = os.environ.get(LOG_ENV) or None
    armed = False
    try:
        for point in RUST_POINTS:
            for action, attempt in _matching(point, batch, partition):
                where = "driver" if attempt is None else "task"
                note = _log_line(point, batch, partition, action, where) if log else None
                _core.arm_failpoint(point, 1, log, note)
                armed = True
        yield
    finally:
        if armed:
            _core.disarm_failpoints()


def hit(point: str, batch: int, partition: int) -> None:
    if ENV not in os.environ:
        return
    for action, task_attempt in _matching(point, batch, partition):
        _announce(point, batch, partition, action, "driver" if task_attempt is None else "task")
        if action == "kill":
            _kill(task_attempt is not None)
        if action == "sleep":
            time.sleep(3)
            continue
        raise InjectedFailure(f"injected failure at {point} (batch {batch}, partition {partition})")


def hit_off_task(point: str, batch: int, partition: int, attempt: int | None) -> None:
    """:func:`hit` for a point of :data:`OFF_TASK_POINTS`, on a worker's own
    thread: `attempt` is that of the task (batch, partition) the work came
    from; a kill is of this Python worker alone (whatever task it runs
    then), a sleep stalls the thread."""
    if ENV not in os.environ:
        return
    for action, _ in _matching(point, batch, partition, attempt or 0):
        _announce(point, batch, partition, action, "worker")
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3)
