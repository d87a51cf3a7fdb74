"""snapcut's Python channel vs queue.Queue moving 10k objects between two threads.

Run: python -m pytest bench/test_channel_py.py --benchmark-only
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from snapcut._core import channel

N = 10_000
CAPACITY = 64


def _snapcut_one_by_one() -> int:
    tx, rx = channel(CAPACITY)

    def produce() -> None:
        for i in range(N):
            tx.send(i)
        tx.close()

    t = threading.Thread(target=produce)
    t.start()
    total = sum(rx)
    t.join()
    return total


def _snapcut_batched() -> int:
    tx, rx = channel(CAPACITY)
    items = list(range(N))

    def produce() -> None:
        for start in range(0, N, CAPACITY):
            tx.send_many(items[start : start + CAPACITY])
        tx.close()

    t = threading.Thread(target=produce)
    t.start()
    total = 0
    got = 0
    while got < N:
        batch = rx.recv_many(CAPACITY)
        got += len(batch)
        total += sum(batch)
    t.join()
    return total


def _queue_queue() -> int:
    q: queue.Queue[Any] = queue.Queue(CAPACITY)
    done = object()

    def produce() -> None:
        for i in range(N):
            q.put(i)
        q.put(done)

    t = threading.Thread(target=produce)
    t.start()
    total = 0
    while (item := q.get()) is not done:
        total += item
    t.join()
    return total


EXPECTED = N * (N - 1) // 2


def test_snapcut_channel_one_by_one(benchmark: Any) -> None:
    assert benchmark(_snapcut_one_by_one) == EXPECTED


def test_snapcut_channel_batched(benchmark: Any) -> None:
    assert benchmark(_snapcut_batched) == EXPECTED


def test_queue_queue(benchmark: Any) -> None:
    assert benchmark(_queue_queue) == EXPECTED
