"""OS threads of this test process with a name of their own (PR_SET_NAME), so
that /proc/self/task tells them apart from every other thread pytest runs."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def named_thread(name: str, work: Callable[[], None] | None = None) -> Iterator[int]:
    """Starts a thread that names itself `name` (at most 15 bytes), runs
    `work` if given, and stays alive until the block ends (an ended thread
    leaves /proc/self/task). Yields its thread id once `work` is done."""
    ready, release = threading.Event(), threading.Event()
    tid: list[int] = []

    def body() -> None:
        ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # 15: PR_SET_NAME
        tid.append(threading.get_native_id())
        if work is not None:
            work()
        ready.set()
        release.wait(60)

    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    try:
        assert ready.wait(60), f"thread {name} did not start"
        yield tid[0]
    finally:
        release.set()
        worker.join()
