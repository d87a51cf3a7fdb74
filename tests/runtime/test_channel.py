"""The Python binding of the SPSC channel: objects cross threads by reference."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pyarrow as pa
import pytest

from snapcut import ChannelClosedError, ConfigError
from snapcut._core import Sender, channel


def test_capacity_zero_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        channel(0)


def test_negative_timeout_is_a_config_error() -> None:
    tx, rx = channel(1)
    with pytest.raises(ConfigError, match="timeout"):
        rx.recv(timeout=-1.0)
    with pytest.raises(ConfigError, match="timeout"):
        tx.send(1, timeout=float("nan"))


def test_fifo_try_ops_len_capacity() -> None:
    tx, rx = channel(3)
    assert (tx.capacity, rx.capacity, len(rx)) == (3, 3, 0)
    assert [tx.try_send(i) for i in range(4)] == [True, True, True, False]
    assert len(tx) == len(rx) == 3
    assert rx.try_recv() == 0
    marker = object()
    assert rx.recv_many(10) == [1, 2]
    assert rx.try_recv(marker) is marker
    assert rx.try_recv_many(5) == []


def test_timeouts_raise_timeout_error() -> None:
    tx, rx = channel(1)
    with pytest.raises(TimeoutError):
        rx.recv(timeout=0.01)
    with pytest.raises(TimeoutError):
        rx.recv_many(4, timeout=0.01)
    tx.send("a")
    with pytest.raises(TimeoutError):
        tx.send("b", timeout=0.01)
    with pytest.raises(TimeoutError):
        tx.send_many(["b", "c"], timeout=0.01)
    assert rx.recv(timeout=1.0) == "a"


def _produce(tx: Sender, items: list[object]) -> None:
    with tx:
        for i, item in enumerate(items):
            if i % 2:
                tx.send(item)
            else:
                tx.send_many([item])


def test_numpy_arrays_cross_threads_zero_copy_in_order() -> None:
    arrays = [np.arange(1000, dtype=np.int64) + i for i in range(200)]
    addresses = [a.__array_interface__["data"][0] for a in arrays]
    tx, rx = channel(4)
    t = threading.Thread(target=_produce, args=(tx, arrays))
    t.start()
    received = list(rx)  # iterates until the sender closes
    t.join()
    assert [a.__array_interface__["data"][0] for a in received] == addresses
    assert all(int(a[0]) == i for i, a in enumerate(received))


def test_record_batches_cross_threads_zero_copy() -> None:
    batches = [
        pa.record_batch({"user": pa.array([i, i + 1]), "dwell_ms": pa.array([1.5, 2.5])})
        for i in range(100)
    ]
    addresses = [b.column(0).buffers()[1].address for b in batches]
    tx, rx = channel(2)
    t = threading.Thread(target=_produce, args=(tx, batches))
    t.start()
    got: list[pa.RecordBatch] = []
    while True:
        try:
            got.extend(rx.recv_many(8, timeout=10.0))
        except ChannelClosedError:
            break
    t.join()
    assert [b.column(0).buffers()[1].address for b in got] == addresses
    assert [b.column(0)[0].as_py() for b in got] == list(range(100))


def test_receiver_drains_before_closed_error() -> None:
    tx, rx = channel(4)
    tx.send_many([1, 2, 3])
    tx.close()
    assert rx.is_closed
    assert rx.recv() == 1
    assert rx.recv_many(5) == [2, 3]
    with pytest.raises(ChannelClosedError):
        rx.recv()
    with pytest.raises(ChannelClosedError):
        rx.try_recv()
    with pytest.raises(ChannelClosedError):
        rx.try_recv_many(1)


def test_sender_errors_once_receiver_closed() -> None:
    tx, rx = channel(2)
    rx.close()
    assert tx.is_closed
    with pytest.raises(ChannelClosedError):
        tx.send(1)
    with pytest.raises(ChannelClosedError):
        tx.try_send(1)
    with pytest.raises(ChannelClosedError):
        tx.send_many([1])


def test_closed_end_itself_raises() -> None:
    tx, rx = channel(2)
    tx.close()
    with pytest.raises(ChannelClosedError):
        tx.send(1)
    rx.close()
    with pytest.raises(ChannelClosedError):
        rx.recv(timeout=0.1)
    assert len(rx) == 0


def test_blocked_sender_wakes_when_receiver_closes() -> None:
    tx, rx = channel(1)
    tx.send(0)
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            tx.send(1)
        except ChannelClosedError as e:
            errors.append(e)

    t = threading.Thread(target=blocked)
    t.start()
    rx.close()
    t.join(timeout=10.0)
    assert not t.is_alive()
    assert len(errors) == 1


class _Tracked:
    pass


def test_queued_objects_released_on_close_and_on_drop() -> None:
    tx, rx = channel(8)
    objs = [_Tracked() for _ in range(5)]
    refs = [weakref.ref(o) for o in objs]
    tx.send_many(objs)
    del objs
    assert rx.recv() is not None  # one received and dropped right away
    gc.collect()
    assert sum(r() is None for r in refs) == 1
    rx.close()  # the 4 queued ones are released with the receiving end
    gc.collect()
    assert all(r() is None for r in refs)
    # Dropping both ends with objects inside releases them too.
    tx2, rx2 = channel(4)
    obj = _Tracked()
    ref = weakref.ref(obj)
    tx2.send(obj)
    del obj, tx2, rx2
    gc.collect()
    assert ref() is None


def test_many_objects_fifo_with_small_ring() -> None:
    n = 20_000
    tx, rx = channel(3)

    def produce() -> None:
        for start in range(0, n, 100):
            tx.send_many(list(range(start, start + 100)))
        tx.close()

    t = threading.Thread(target=produce)
    t.start()
    got: list[int] = []
    for item in rx:
        got.append(item)
    t.join()
    assert got == list(range(n))


def test_blocked_receiver_wakes_when_sender_closes() -> None:
    tx, rx = channel(1)
    outcome: list[str] = []

    def blocked() -> None:
        try:
            rx.recv()
        except ChannelClosedError:
            outcome.append("closed")

    t = threading.Thread(target=blocked)
    t.start()
    tx.close()
    t.join(timeout=10.0)
    assert not t.is_alive()
    assert outcome == ["closed"]
