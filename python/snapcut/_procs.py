"""The processes of a Spark driver, for crash tests and chaos (Linux ``/proc``).

A PySpark driver is a Python process whose child is the JVM (``spark-submit``
in the same process group); the JVM starts ``pyspark.daemon`` in a process
group of its own, which forks the Python workers; under ``local-cluster``
the JVM also starts executor JVMs (``CoarseGrainedExecutorBackend``), each
with its own daemon. Killing "the driver" like a machine failure means
SIGKILLing all of them at once: :func:`kill_tree`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
EXECUTOR_CLASS = "CoarseGrainedExecutorBackend"


@dataclass(frozen=True)
class Proc:
    """One process; (pid, start) names it even after the pid is reused."""

    pid: int
    ppid: int
    pgrp: int
    start: int
    """Start time in clock ticks since boot."""


def _stat(pid: int) -> tuple[Proc, str] | None:
    """The process `pid` and its state letter, or None if it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses.
    fields = raw[raw.rindex(")") + 2 :].split()
    return Proc(pid, int(fields[1]), int(fields[2]), int(fields[19])), fields[0]


def processes() -> list[Proc]:
    """Every live process of the machine (zombies excluded)."""
    out = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            found = _stat(int(entry.name))
            if found is not None and found[1] not in ("Z", "X"):
                out.append(found[0])
    return out


def tree(pid: int) -> list[Proc]:
    """`pid` and all its live descendants, parents first ([] if `pid` is gone)."""
    procs = processes()
    children: dict[int, list[Proc]] = {}
    root = None
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
        if p.pid == pid:
            root = p
    if root is None:
        return []
    out = [root]
    for p in out:
        out.extend(children.get(p.pid, []))
    return out


def alive(p: Proc) -> bool:
    """Whether `p` (the same process, not a reuse of its pid) still runs."""
    found = _stat(p.pid)
    return found is not None and found[0].start == p.start and found[1] not in ("Z", "X")


def kill(procs: list[Proc]) -> None:
    """SIGKILLs `procs`: whole process groups where a member leads the group
    (the driver's own group if it leads it, pyspark's daemon group: workers
    it forks meanwhile die too), single processes otherwise. The calling
    process, if listed, dies last."""
    me = os.getpid()
    members = {p.pid for p in procs}
    groups = {p.pgrp for p in procs if p.pgrp in members}
    own_group = os.getpgrp()
    for g in sorted(groups - {own_group}):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(g, signal.SIGKILL)
    for p in procs:
        if p.pid != me and p.pgrp not in groups and alive(p):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, signal.SIGKILL)
    if own_group in groups:
        os.killpg(own_group, signal.SIGKILL)
    if me in members:
        os.kill(me, signal.SIGKILL)


def kill_tree(pid: int) -> list[Proc]:
    """SIGKILLs `pid` and its descendants (see :func:`kill`); returns them."""
    procs = tree(pid)
    kill(procs)
    return procs


def wait_gone(procs: list[Proc], timeout: float = 10.0) -> list[Proc]:
    """Waits until none of `procs` runs; returns those still running."""
    deadline = time.monotonic() + timeout
    left = [p for p in procs if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if alive(p)]
    return left


def command_line(p: Proc) -> str:
    try:
        raw = (PROC / str(p.pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def executors(pid: int) -> list[Proc]:
    """The executor JVMs (``local-cluster``) among `pid`'s descendants."""
    return [p for p in tree(pid)[1:] if EXECUTOR_CLASS in command_line(p)]
