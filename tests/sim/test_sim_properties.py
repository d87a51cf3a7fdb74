"""Hypothesis over thousands of seeds: random strongly connected banks,
random transfers and deliveries, concurrent snapshots from random initiators.
Every snapshot terminates, conserves the total and is a consistent cut."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from snapcut.sim import Simulation, TopologyName

topologies: st.SearchStrategy[TopologyName] = st.sampled_from(["complete", "ring", "random"])


@settings(max_examples=2000, deadline=None)
@given(
    processes=st.integers(1, 8),
    seed=st.integers(0, 2**64 - 1),
    topology=topologies,
    steps=st.integers(0, 400),
    every=st.integers(1, 40),
)
def test_every_snapshot_is_a_consistent_cut(
    processes: int, seed: int, topology: TopologyName, steps: int, every: int
) -> None:
    sim = Simulation.random(processes=processes, seed=seed, topology=topology, balance=500)
    sim.run(steps=steps, snapshot_every=every)
    sim.drain()
    snaps = sim.snapshots()
    # With two or more processes someone can always send, so no run stops early.
    assert len(snaps) == steps // every or (processes == 1 and len(snaps) <= steps // every)
    for snap in snaps:
        assert snap.complete, f"seed {seed}: snapshot {snap.id} did not terminate"
        assert len(snap.processes) == processes
        assert snap.total() == sim.total == 500 * processes
        assert snap.is_consistent()
        assert sim.verify(snap.id) is None


@settings(max_examples=300, deadline=None)
@given(
    processes=st.integers(2, 6),
    seed=st.integers(0, 2**64 - 1),
    max_transfers=st.integers(0, 8),
    at=st.integers(0, 200),
)
def test_termination_snapshots_are_sound_and_complete(
    processes: int, seed: int, max_transfers: int, at: int
) -> None:
    sim = Simulation.random(
        processes=processes, seed=seed, topology="random", max_transfers=max_transfers
    )
    for _ in range(at):
        sim.step()
    was_terminated = sim.terminated
    sid = sim.start_snapshot("P0")
    sim.drain()
    snap = sim.snapshot(sid)
    assert snap.complete
    if was_terminated:
        assert snap.is_terminated()
    if snap.is_terminated():
        assert sim.terminated
