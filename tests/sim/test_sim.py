"""The Chandy-Lamport bank simulator: worked examples reproduced exactly,
typed errors, exact replay from a seed."""

from __future__ import annotations

import pytest

from snapcut import ConfigError, GraphError
from snapcut.sim import GlobalSnapshot, Marker, Simulation


def test_design_two_process_example() -> None:
    sim = Simulation({"A": 10000, "B": 5000})
    sim.send("A", "B", 1000)
    assert sim.balances == {"A": 9000, "B": 5000}
    sid = sim.start_snapshot("A")
    assert sim.in_flight("A", "B") == [1000, Marker(sid)]
    sim.send("B", "A", 1000)
    sim.send("B", "A", 2000)
    assert sim.deliver("A", "B") == 1000
    assert sim.balances["B"] == 3000
    assert sim.deliver("A", "B") == Marker(sid)
    assert sim.in_flight("B", "A") == [1000, 2000, Marker(sid)]
    assert sim.deliver("B", "A") == 1000
    assert sim.deliver("B", "A") == 2000
    assert sim.balances == {"A": 12000, "B": 3000}
    assert not sim.snapshot(sid).complete
    assert sim.deliver("B", "A") == Marker(sid)
    snap = sim.snapshot(sid)
    assert snap.complete
    assert snap.processes == {"A": 9000, "B": 3000}
    assert snap.channels == {("A", "B"): [], ("B", "A"): [1000, 2000]}
    assert snap.total() == 15000
    assert snap.is_consistent()
    assert sim.verify(sid) is None


def test_seeds_three_process_example() -> None:
    """Gupta's example from the seeds: P1 initiates after local events a, b;
    P3 records first, P2 last; M[hd] (P2's send at h, received by P1 at d)
    is the one message recorded, on C21."""
    sim = Simulation({"P1": 1000, "P2": 2000, "P3": 3000})
    sid = sim.start_snapshot("P1")  # after a, b
    sim.send("P2", "P1", 50)  # h (after f, g)
    assert sim.deliver("P1", "P3") == Marker(sid)  # P3 records {i}, C13 = []
    assert sim.deliver("P3", "P1") == Marker(sid)  # C31 = []
    assert sim.deliver("P3", "P2") == Marker(sid)  # P2 records {f, g, h}, C32 = []
    assert sim.deliver("P1", "P2") == Marker(sid)  # C12 = []: P2 done
    assert sim.deliver("P2", "P1") == 50  # d: recorded on C21
    assert sim.deliver("P2", "P1") == Marker(sid)  # C21 = [M[hd]]: P1 done
    assert not sim.snapshot(sid).complete
    assert sim.deliver("P2", "P3") == Marker(sid)  # C23 = []: P3 done
    snap = sim.snapshot(sid)
    assert snap.complete
    assert snap.order == ["P1", "P3", "P2"]
    assert snap.processes == {"P1": 1000, "P2": 1950, "P3": 3000}
    assert snap.channels == {
        ("P1", "P2"): [],
        ("P1", "P3"): [],
        ("P2", "P1"): [50],
        ("P2", "P3"): [],
        ("P3", "P1"): [],
        ("P3", "P2"): [],
    }
    assert snap.is_consistent()
    assert sim.verify(sid) is None


def test_concurrent_snapshots_from_two_initiators() -> None:
    sim = Simulation({"A": 100, "B": 100, "C": 100}, topology=[("A", "B"), ("B", "C"), ("C", "A")])
    s1 = sim.start_snapshot("A")
    sim.send("C", "A", 30)
    s2 = sim.start_snapshot("B")
    sims = sim.drain()
    assert sorted(s.id for s in sims) == [s1, s2]
    for s in sims:
        assert s.complete and s.total() == 300 and s.is_consistent()
        assert sim.verify(s.id) is None
    # A recorded before C's 30 arrived: it is in flight in snapshot 1.
    assert sim.snapshot(s1).channels[("C", "A")] == [30]


def test_errors_are_typed_and_name_the_problem() -> None:
    sim = Simulation({"A": 100, "B": 0}, topology=[("A", "B")])
    with pytest.raises(GraphError, match='unknown process "Z"'):
        sim.send("Z", "A", 1)
    with pytest.raises(GraphError, match="no channel B→A"):
        sim.send("B", "A", 1)
    with pytest.raises(ConfigError, match="insufficient balance: A has 100"):
        sim.send("A", "B", 101)
    with pytest.raises(ConfigError, match="must be positive, got -5"):
        sim.send("A", "B", -5)
    with pytest.raises(ConfigError, match="A→B is empty"):
        sim.deliver("A", "B")
    with pytest.raises(ConfigError, match="unknown snapshot id 9"):
        sim.snapshot(9)
    with pytest.raises(GraphError, match="unknown process"):
        sim.start_snapshot("nobody")
    with pytest.raises(GraphError, match="unknown process"):
        Simulation({"A": 1}, topology=[("A", "Q")])
    with pytest.raises(ConfigError, match="negative initial balance"):
        Simulation({"A": -1})
    with pytest.raises(ConfigError, match="unknown topology"):
        Simulation.random(topology="star")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="snapshot_every must be >= 1"):
        sim.run(10, snapshot_every=0)
    # Nothing was changed by the failed calls.
    assert sim.balances == {"A": 100, "B": 0}


def test_random_run_replays_from_its_seed() -> None:
    def run(seed: int) -> tuple[list[GlobalSnapshot], dict[str, int]]:
        sim = Simulation.random(processes=6, seed=seed, topology="random")
        done = sim.run(steps=3000, snapshot_every=50)
        return done, sim.balances

    a, b = run(7), run(7)
    assert a == b
    assert len(a[0]) > 10
    assert run(8) != a


def test_run_snapshots_conserve_money() -> None:
    sim = Simulation.random(processes=8, seed=7)
    done = sim.run(steps=10_000, snapshot_every=50) + sim.drain()
    assert len(done) == len(sim.snapshots()) == 200
    for snap in done:
        assert snap.total() == sim.total == 8000
        assert snap.is_consistent()
        assert sim.verify(snap.id) is None


def test_termination_is_detected_only_once_it_holds() -> None:
    sim = Simulation.random(processes=4, seed=3, max_transfers=5)
    early = sim.start_snapshot("P0")
    sim.run(steps=10_000)
    sim.drain()
    assert sim.terminated
    assert not sim.snapshot(early).is_terminated()
    late = sim.start_snapshot("P2")
    sim.drain()
    assert sim.snapshot(late).is_terminated()


def test_snapshot_stays_incomplete_when_markers_cannot_reach_everyone() -> None:
    sim = Simulation({"A": 5, "B": 5, "C": 5}, topology=[("A", "B"), ("C", "A")])
    sid = sim.start_snapshot("A")
    sim.send("C", "A", 2)
    assert sim.drain() == []
    snap = sim.snapshot(sid)
    assert not snap.complete
    assert set(snap.processes) == {"A", "B"}
    assert snap.is_consistent()  # on the channels whose both ends recorded
    assert sim.verify(sid) == f"snapshot {sid} is not complete"


def test_more_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="at least one process"):
        Simulation({})
    with pytest.raises(ConfigError, match="processes must be >= 1"):
        Simulation.random(processes=0)
    with pytest.raises(GraphError, match="self-loop"):
        Simulation({"A": 1}, topology=[("A", "A")])
    with pytest.raises(GraphError, match="listed twice"):
        Simulation({"A": 1, "B": 1}, topology=[("A", "B"), ("A", "B")])
    sim = Simulation({"A": 1, "B": 1})
    sim.halt("A")
    with pytest.raises(ConfigError, match="halted"):
        sim.send("A", "B", 1)


def test_is_consistent_can_fail() -> None:
    snap = GlobalSnapshot(
        id=1,
        initiator="A",
        complete=True,
        processes={"A": 10, "B": 10},
        channels={("A", "B"): [], ("B", "A"): []},
        sent={("A", "B"): 0, ("B", "A"): 0},
        received={("A", "B"): 1, ("B", "A"): 0},
    )
    assert not snap.is_consistent()


def test_module_docstring_example_runs() -> None:
    import doctest

    import snapcut.sim

    result = doctest.testmod(snapcut.sim)
    assert result.attempted > 0
    assert result.failed == 0
