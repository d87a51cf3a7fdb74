"""Crash points inside Spark tasks, for the exactly-once tests and chaos.

``SNAPCUT_SPARK_FAILPOINTS`` arms them, comma-separated, each
``point:batch:partition:action[:attempt]``::

    state.after_write:2:0:raise:0    # attempt 0 of batch 2, partition 0 raises
    state.after_ack:3:1:kill         # the Python worker SIGKILLs itself
    sink.after_commit:1:*:raise      # the driver fails after the sink committed batch 1

``raise`` fails the task (Spark retries it); ``kill`` dies as an external
``kill -9`` of the worker would; ``sleep`` stalls 3 s (a straggler, for
speculation). ``*`` matches any batch or partition; the driver-side sink
points (``sink.before_commit``, ``sink.after_commit``) hit with partition 0
and read the variable from the driver's own environment. The variable reaches
Python workers through ``spark.executorEnv.*``; a value ``@/path`` reads the
points from that file at every hit, so a test can re-arm a running session.
"""

from __future__ import annotations

import os
import signal
import time

from snapcut._core import ConfigError

ENV = "SNAPCUT_SPARK_FAILPOINTS"
POINTS = {
    "state.before_write": "the batch was applied to the state, version N is not written",
    "state.after_write": "version N's state file is written, not yet acknowledged",
    "state.after_ack": "version N is acknowledged, the manifest may not be written",
    "sink.before_stage": "a sink task is about to stage its output file(s) of batch N",
    "sink.after_stage": "a sink task staged its output file(s), its result is not yet returned",
    "sink.before_commit": "driver: batch N's output is staged (and its state acked), no manifest",
    "sink.after_commit": "driver: batch N's manifest is published, Spark has not committed N",
}
ACTIONS = ("raise", "kill", "sleep")


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


def _attempt() -> int:
    try:
        from pyspark import TaskContext
    except ImportError:
        return 0
    ctx = TaskContext.get()
    return ctx.attemptNumber() if ctx is not None else 0


def hit(point: str, batch: int, partition: int) -> None:
    if ENV not in os.environ:
        return
    for name, b, p, action, attempt in _armed():
        if name != point or b not in ("*", str(batch)) or p not in ("*", str(partition)):
            continue
        if attempt is not None and attempt != str(_attempt()):
            continue
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "sleep":
            time.sleep(3)
            continue
        raise InjectedFailure(f"injected failure at {point} (batch {batch}, partition {partition})")
