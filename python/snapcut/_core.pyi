"""Type stubs of the Rust extension module snapcut._core."""

__version__: str

class SnapcutError(Exception): ...
class ChannelClosedError(SnapcutError): ...
class ConfigError(SnapcutError): ...
class GraphError(SnapcutError): ...
class SnapshotError(SnapcutError): ...
class TaskError(SnapcutError): ...
class StorageError(SnapcutError): ...

def protocol_name(name: str) -> str:
    """Validates a protocol name; returns its canonical spelling or raises ConfigError."""

# --- channel ---

from collections.abc import Iterator as _Iterator  # noqa: E402
from typing import Any as _Any  # noqa: E402

class Sender:
    """The sending end of a bounded FIFO channel of Python objects (one producer thread)."""

    @property
    def capacity(self) -> int: ...
    @property
    def is_closed(self) -> bool:
        """Whether the receiver (or this end) was closed."""

    def send(self, obj: object, timeout: float | None = None) -> None:
        """Sends `obj`, waiting (GIL released) while full; TimeoutError after `timeout` s."""

    def try_send(self, obj: object) -> bool:
        """Sends `obj` if there is room; returns whether it was sent."""

    def send_many(self, objs: list[_Any], timeout: float | None = None) -> None:
        """Sends every object in order, as many at once as fit, waiting for room."""

    def close(self) -> None:
        """Closes this end: the receiver drains what is queued, then gets ChannelClosedError."""

    def __len__(self) -> int: ...
    def __enter__(self) -> Sender: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...

class Receiver:
    """The receiving end of a bounded FIFO channel of Python objects (one consumer thread)."""

    @property
    def capacity(self) -> int: ...
    @property
    def is_closed(self) -> bool:
        """Whether the sender (or this end) was closed; objects may still be queued."""

    def recv(self, timeout: float | None = None) -> _Any:
        """The oldest object, waiting (GIL released) while empty; ChannelClosedError when
        the sender is closed and the channel drained; TimeoutError after `timeout` s."""

    def try_recv(self, default: object = None) -> _Any:
        """The oldest object if one is queued, else `default`."""

    def recv_many(self, max: int, timeout: float | None = None) -> list[_Any]:
        """Up to `max` queued objects, oldest first, waiting for at least one."""

    def try_recv_many(self, max: int) -> list[_Any]:
        """Up to `max` objects queued right now (possibly none)."""

    def close(self) -> None:
        """Closes this end and releases the queued objects; the sender gets ChannelClosedError."""

    def __len__(self) -> int: ...
    def __iter__(self) -> _Iterator[_Any]: ...
    def __next__(self) -> _Any: ...
    def __enter__(self) -> Receiver: ...
    def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...

def channel(capacity: int) -> tuple[Sender, Receiver]:
    """A bounded FIFO channel for `capacity` objects; ConfigError if capacity is 0."""
