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

from snapcut._core import ConfigError

ENV = "SNAPCUT_SPARK_FAILPOINTS"
LOG_ENV = "SNAPCUT_SPARK_FAILPOINT_LOG"
POINTS = {
    "state.before_write": "the batch was applied to the state, version N is not written",
    "state.after_write": "version N's state file is written, not yet acknowledged",
    "state.after_ack": "version N is acknowledged, the manifest may not be written",
    "sink.before_stage": "a sink task is about to stage its output file(s) of batch N",
    "sink.after_stage": "a sink task staged its output file(s), its result is not yet returned",
    "sink.before_commit": "driver: batch N's output is staged (and its state acked), no manifest",
    "sink.after_table_commit": "driver: batch N is in the Delta table, its manifest is not",
    "sink.after_commit": "driver: batch N's manifest is published, Spark has not committed N",
}
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
        out.append((parts[0], parts[1], parts[2], parts[3], parts[4] if len(parts) == 5 else None))
    return out


def _task_attempt() -> int | None:
    """The running task's attempt number; None outside a task (the driver)."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return None
    ctx = TaskContext.get()
    return ctx.attemptNumber() if ctx is not None else None


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
    line = json.dumps(
        {
            "point": point,
            "batch": batch,
            "partition": partition,
            "action": action,
            "where": where,
            "pid": os.getpid(),
        }
    )
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


def hit(point: str, batch: int, partition: int) -> None:
    if ENV not in os.environ:
        return
    for name, b, p, action, attempt in _armed():
        if name != point or b not in ("*", str(batch)) or p not in ("*", str(partition)):
            continue
        task_attempt = _task_attempt()
        if attempt is not None and attempt != str(task_attempt or 0):
            continue
        _announce(point, batch, partition, action, "driver" if task_attempt is None else "task")
        if action == "kill":
            _kill(task_attempt is not None)
        if action == "sleep":
            time.sleep(3)
            continue
        raise InjectedFailure(f"injected failure at {point} (batch {batch}, partition {partition})")
