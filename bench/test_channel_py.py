"""Group ``channel``: moving 10k Python ints from one thread to another through
snapcut's channel (one by one, and in batches of 64), ``queue.Queue`` (the
baseline: what Python code uses) and ``collections.deque``.

The channel and the queue are bounded (64) and block with the GIL released
(the channel) or on a condition variable (the queue). A deque cannot block:
the producer appends without bound (no backpressure) and the consumer polls,
yielding the GIL with ``time.sleep(0)`` when it finds the deque empty.

On a 2-vCPU guest the two threads sometimes share one core, so the figures are
bimodal: read both modes (bench/README.md, ``bench/compare.py --modes``).

Run: pytest bench/test_channel_py.py --benchmark-only
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any

import pytest

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


def _deque() -> int:
    d: deque[Any] = deque()
    done = object()

    def produce() -> None:
        for i in range(N):
            d.append(i)
        d.append(done)

    t = threading.Thread(target=produce)
    t.start()
    total = 0
    while True:
        try:
            item = d.popleft()
        except IndexError:
            time.sleep(0)
            continue
        if item is done:
            break
        total += item
    t.join()
    return total


EXPECTED = N * (N - 1) // 2
pytestmark = pytest.mark.benchmark(group="channel")


def test_snapcut_channel_one_by_one(benchmark: Any) -> None:
    assert benchmark(_snapcut_one_by_one) == EXPECTED


def test_snapcut_channel_batched(benchmark: Any) -> None:
    assert benchmark(_snapcut_batched) == EXPECTED


def test_queue_queue(benchmark: Any) -> None:
    benchmark.extra_info["baseline"] = True
    assert benchmark(_queue_queue) == EXPECTED


def test_deque_polling(benchmark: Any) -> None:
    assert benchmark(_deque) == EXPECTED
