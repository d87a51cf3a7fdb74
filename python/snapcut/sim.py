"""Deterministic simulator of the Chandy-Lamport snapshot algorithm on a bank.

Processes hold balances and send each other money over FIFO channels (every
ordered pair unless a topology is given). Any process may start a snapshot;
several may be in flight. Every process runs snapcut's real Chandy-Lamport
state machine (Rust); every delivery is chosen by the caller or by a seeded
PRNG, so every run replays exactly from its seed.

>>> sim = Simulation({"A": 10000, "B": 5000})
>>> sim.send("A", "B", 1000)
>>> sid = sim.start_snapshot("A")
>>> sim.send("B", "A", 1000); sim.send("B", "A", 2000)
>>> for _ in range(2): _ = sim.deliver("A", "B")
>>> for _ in range(3): _ = sim.deliver("B", "A")
>>> snap = sim.snapshot(sid)
>>> snap.processes, snap.channels[("B", "A")]
({'A': 9000, 'B': 3000}, [1000, 2000])

`run_dataflow` drives the dataflow protocols (aligned, unaligned, sync,
chandy-lamport) the same way over random DAGs and cyclic graphs, checking
that every checkpoint is a consistent cut. `run_failover` makes tasks fail
mid-run and restarts them by the runtime's own failover rule ("region",
"full" or "upstream"), so the sinks' outputs can be compared with a
failure-free run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

from snapcut._core import BankSim, simulate_dataflow, simulate_failover

__all__ = [
    "CheckpointOutcome",
    "DataflowReport",
    "FailoverReport",
    "GlobalSnapshot",
    "Marker",
    "Message",
    "Simulation",
    "TopologyName",
    "run_dataflow",
    "run_failover",
]

Channel = tuple[str, str]
TopologyName = Literal["complete", "ring", "random"]


@dataclass(frozen=True)
class Marker:
    """A Chandy-Lamport marker of snapshot `id` travelling on a channel."""

    id: int


Message = int | Marker
"""What a channel carries: an amount of money, or a marker."""


def _message(raw: tuple[str, int]) -> Message:
    kind, value = raw
    return Marker(value) if kind == "marker" else value


@dataclass(frozen=True)
class GlobalSnapshot:
    """One global snapshot, as recorded so far.

    `processes` maps each process that recorded its state to its recorded
    balance; `channels` maps each channel `(src, dst)` whose destination
    recorded to the money recorded in flight on it. `sent[(s, d)]` is how
    many transfers `s` had sent on that channel when `s` recorded;
    `received[(s, d)]` how many `d` had received when `d` recorded.
    """

    id: int
    initiator: str
    complete: bool
    processes: dict[str, int]
    channels: dict[Channel, list[int]]
    halted: dict[str, bool] = field(default_factory=dict)
    sent: dict[Channel, int] = field(default_factory=dict)
    received: dict[Channel, int] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def total(self) -> int:
        """Recorded balances plus recorded in-flight money."""
        return sum(self.processes.values()) + sum(sum(m) for m in self.channels.values())

    def is_consistent(self) -> bool:
        """No transfer recorded as received whose sending is not recorded, and
        every transfer recorded as sent but not received is recorded in flight.

        Channels are FIFO, so per-channel counts decide it: received <= sent and
        the channel holds exactly sent - received amounts. Only channels whose
        both ends have recorded are checked (all of them, once `complete`).
        """
        for ch in self.sent.keys() & self.received.keys():
            sent, received = self.sent[ch], self.received[ch]
            if received > sent or len(self.channels.get(ch, [])) != sent - received:
                return False
        return True

    def is_terminated(self) -> bool:
        """The stable property "the bank has terminated", evaluated on the
        snapshot: every process halted and every recorded channel empty."""
        return (
            self.complete
            and all(self.halted.values())
            and all(not m for m in self.channels.values())
        )

    @staticmethod
    def _from_raw(raw: dict[str, object]) -> GlobalSnapshot:
        return GlobalSnapshot(
            id=cast(int, raw["id"]),
            initiator=cast(str, raw["initiator"]),
            complete=cast(bool, raw["complete"]),
            processes=cast(dict[str, int], raw["processes"]),
            channels=cast(dict[Channel, list[int]], raw["channels"]),
            halted=cast(dict[str, bool], raw["halted"]),
            sent=cast(dict[Channel, int], raw["sent"]),
            received=cast(dict[Channel, int], raw["received"]),
            order=cast(list[str], raw["order"]),
        )


class Simulation:
    """A bank of processes and FIFO channels running Chandy-Lamport snapshots.

    A snapshot completes only if markers reach every process from its
    initiator: with a `topology` that is not strongly connected, some
    snapshots stay incomplete (`GlobalSnapshot.complete` is False).

    Errors: unknown process or missing channel raise `GraphError`; a
    non-positive amount, insufficient balance, delivering from an empty
    channel, a halted sender or an unknown snapshot id raise `ConfigError`.
    """

    def __init__(
        self,
        balances: Mapping[str, int],
        topology: Sequence[Channel] | None = None,
        seed: int = 0,
    ) -> None:
        self._sim = BankSim(
            list(balances.items()),
            None if topology is None else [(s, d) for s, d in topology],
            seed,
        )

    @classmethod
    def random(
        cls,
        processes: int = 8,
        seed: int = 0,
        balance: int = 1000,
        topology: TopologyName = "complete",
        max_transfers: int | None = None,
    ) -> Simulation:
        """`processes` processes P0.. with `balance` each, on a strongly
        connected topology; random steps (transfers, deliveries) come from
        `seed`. With `max_transfers` each process halts after that many sends.
        """
        sim = cls.__new__(cls)
        sim._sim = BankSim.random(processes, seed, balance, topology, max_transfers)
        return sim

    @property
    def processes(self) -> list[str]:
        return self._sim.names

    @property
    def topology(self) -> list[Channel]:
        """The channels, as (src, dst) pairs."""
        return self._sim.edges

    @property
    def balances(self) -> dict[str, int]:
        """Live balances."""
        return dict(zip(self._sim.names, self._sim.balances, strict=True))

    @property
    def total(self) -> int:
        """The money in the system (conserved)."""
        return self._sim.total

    @property
    def terminated(self) -> bool:
        """Live: every process halted and no money in flight."""
        return self._sim.terminated

    def send(self, src: str, dst: str, amount: int) -> None:
        """Takes `amount` from `src` and puts it on channel src->dst."""
        self._sim.send(src, dst, amount)

    def halt(self, process: str) -> None:
        """`process` will send no more money."""
        self._sim.halt(process)

    def start_snapshot(self, process: str) -> int:
        """`process` records its state and sends markers; returns the snapshot id."""
        return self._sim.start_snapshot(process)

    def deliver(self, src: str, dst: str) -> Message:
        """Delivers the head of channel src->dst to `dst`; returns it."""
        return _message(self._sim.deliver(src, dst))

    def in_flight(self, src: str, dst: str) -> list[Message]:
        """What channel src->dst holds, head first."""
        return [_message(m) for m in self._sim.in_flight(src, dst)]

    def snapshot(self, sid: int) -> GlobalSnapshot:
        """Snapshot `sid` as recorded so far (see `GlobalSnapshot.complete`)."""
        return GlobalSnapshot._from_raw(self._sim.snapshot(sid))

    def snapshots(self) -> list[GlobalSnapshot]:
        """Every snapshot started, by id."""
        return [self.snapshot(i) for i in self._sim.snapshot_ids()]

    def verify(self, sid: int) -> str | None:
        """Checks snapshot `sid` against every amount ever sent (complete,
        recorded channels == money in flight at the cut, total conserved);
        returns the problem found, or None."""
        return self._sim.verify(sid)

    def step(self) -> bool:
        """One random step (a transfer or a delivery); False if none is possible."""
        return self._sim.step()

    def run(self, steps: int, snapshot_every: int | None = None) -> list[GlobalSnapshot]:
        """Up to `steps` random steps, a random process starting a snapshot
        every `snapshot_every` steps; returns the snapshots completed meanwhile."""
        return [self.snapshot(i) for i in self._sim.run(steps, snapshot_every)]

    def drain(self) -> list[GlobalSnapshot]:
        """Delivers everything in flight (no new transfers); returns the
        snapshots completed meanwhile."""
        return [self.snapshot(i) for i in self._sim.drain()]


@dataclass(frozen=True)
class CheckpointOutcome:
    """What became of one checkpoint in a dataflow simulation."""

    id: int
    completed: bool
    aborted: bool
    logged: int
    """Tokens persisted as in-flight data (channel state, back-edge logs)."""


@dataclass(frozen=True)
class DataflowReport:
    """Result of `run_dataflow`. `violation` is None when every step and
    every checkpoint checked out; otherwise it names the problem and the
    configuration that replays it."""

    steps: int
    edges: list[tuple[int, int, bool]]
    """(src, dst, is_back_edge) per channel."""
    tokens_emitted: int
    tokens_delivered: int
    checkpoints: list[CheckpointOutcome]
    timeouts_fired: int
    violation: str | None


def run_dataflow(
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
) -> DataflowReport:
    """Runs `protocol` over a random dataflow drawn from `seed`: `sources` of
    `vertices` emit `tokens_per_source` numbered tokens, tasks pass them on
    (at most `max_hops` hops), `back_edges` back-edges make cycles, the
    coordinator triggers `checkpoints` checkpoints (and aborts one with
    probability 1/`abort_one_in` per step). Deterministic in all arguments.
    Raises ConfigError for an unknown protocol or impossible shape."""
    raw = simulate_dataflow(
        protocol,
        seed,
        vertices=vertices,
        sources=sources,
        back_edges=back_edges,
        extra_edges=extra_edges,
        tokens_per_source=tokens_per_source,
        checkpoints=checkpoints,
        max_hops=max_hops,
        end_of_stream=end_of_stream,
        aligned_first=aligned_first,
        abort_one_in=abort_one_in,
    )
    return DataflowReport(
        steps=cast(int, raw["steps"]),
        edges=cast(list[tuple[int, int, bool]], raw["edges"]),
        tokens_emitted=cast(int, raw["tokens_emitted"]),
        tokens_delivered=cast(int, raw["tokens_delivered"]),
        checkpoints=[
            CheckpointOutcome(*c)
            for c in cast(list[tuple[int, bool, bool, int]], raw["checkpoints"])
        ],
        timeouts_fired=cast(int, raw["timeouts_fired"]),
        violation=cast("str | None", raw["violation"]),
    )


@dataclass(frozen=True)
class FailoverReport:
    """What `run_failover` did.

    edges: (from, to) per channel. published: per sink task, the tokens it
    published (two-phase commit), sorted. counts: per task, the tokens it
    took (its state). failures: per failure, (failed task, tasks restarted,
    why "upstream" fell back to the region or None). replayed_dropped:
    tokens healthy tasks dropped as replays. violation: a sequence gap, a
    deadlock or a protocol error, or None.
    """

    edges: list[tuple[int, int]]
    published: dict[int, list[int]]
    counts: list[int]
    failures: list[tuple[int, list[int], str | None]]
    checkpoints_completed: int
    restored_from: int | None
    replayed_dropped: int
    violation: str | None


def run_failover(
    protocol: str,
    failover: str,
    seed: int = 0,
    *,
    vertices: int = 7,
    sources: int = 2,
    merge_percent: int = 20,
    tokens_per_source: int = 20,
    failures: int = 2,
    dedup: bool = True,
) -> FailoverReport:
    """Runs `protocol` (aligned, unaligned or chandy-lamport) over a random
    DAG drawn from `seed` (`vertices`, `sources` of them sources; a vertex
    gets a second input with `merge_percent` %): tasks count the tokens they
    take and pass them on; sinks publish at checkpoint completion. `failures`
    tasks fail at random steps and restart by `failover` ("region", "full",
    "upstream") from the last completed checkpoint; healthy tasks drop
    replays by channel sequence number unless `dedup` is False (to show what
    that prevents). Deterministic in all arguments; `failures=0` is the
    failure-free run to compare with. Raises ConfigError for a bad argument."""
    raw = simulate_failover(
        protocol,
        failover,
        seed,
        vertices=vertices,
        sources=sources,
        merge_percent=merge_percent,
        tokens_per_source=tokens_per_source,
        failures=failures,
        dedup=dedup,
    )
    return FailoverReport(
        edges=cast(list[tuple[int, int]], raw["edges"]),
        published={int(k): list(v) for k, v in cast(list[tuple[int, list[int]]], raw["published"])},
        counts=cast(list[int], raw["counts"]),
        failures=[
            (int(f), list(ts), why)
            for f, ts, why in cast(list[tuple[int, list[int], str | None]], raw["failures"])
        ],
        checkpoints_completed=cast(int, raw["checkpoints_completed"]),
        restored_from=cast("int | None", raw["restored_from"]),
        replayed_dropped=cast(int, raw["replayed_dropped"]),
        violation=cast("str | None", raw["violation"]),
    )
