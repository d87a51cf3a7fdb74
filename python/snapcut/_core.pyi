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

# --- sim (protocol engineer) ---

class BankSim:
    def __init__(
        self,
        balances: list[tuple[str, int]],
        topology: list[tuple[str, str]] | None = None,
        seed: int = 0,
    ) -> None: ...
    @staticmethod
    def random(
        processes: int = 8,
        seed: int = 0,
        balance: int = 1000,
        topology: str = "complete",
        max_transfers: int | None = None,
    ) -> BankSim: ...
    @property
    def names(self) -> list[str]: ...
    @property
    def edges(self) -> list[tuple[str, str]]: ...
    @property
    def balances(self) -> list[int]: ...
    @property
    def total(self) -> int: ...
    @property
    def terminated(self) -> bool: ...
    def halted(self, process: str) -> bool: ...
    def send(self, src: str, dst: str, amount: int) -> None: ...
    def halt(self, process: str) -> None: ...
    def start_snapshot(self, process: str) -> int: ...
    def deliver(self, src: str, dst: str) -> tuple[str, int]: ...
    def in_flight(self, src: str, dst: str) -> list[tuple[str, int]]: ...
    def snapshot_ids(self) -> list[int]: ...
    def snapshot(self, id: int) -> dict[str, object]: ...
    def verify(self, id: int) -> str | None: ...
    def step(self) -> bool: ...
    def run(self, steps: int, snapshot_every: int | None = None) -> list[int]: ...
    def drain(self) -> list[int]: ...

def simulate_dataflow(
    protocol: str,
    seed: int = 0,
    *,
    vertices: int = 6,
    sources: int = 2,
    back_edges: int = 0,
    extra_edges: int = 3,
    tokens_per_source: int = 30,
    checkpoints: int = 5,
    max_hops: int = 6,
    end_of_stream: bool = False,
    aligned_first: bool = False,
    abort_one_in: int = 0,
) -> dict[str, object]: ...

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
