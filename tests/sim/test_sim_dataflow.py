"""Every protocol driven by the deterministic dataflow simulator from Python:
random DAGs and cyclic graphs, concurrent checkpoints, aborts, alignment
timeouts. Every checkpoint must complete (unless aborted) and be a
consistent cut; a failure names the configuration that replays it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapcut import ConfigError
from snapcut.sim import run_dataflow

PROTOCOLS = [
    ("aligned", False),
    ("unaligned", False),
    ("unaligned", True),
    ("sync", False),
    ("sync-capture", False),
    ("chandy-lamport", False),
]


@settings(max_examples=1500, deadline=None)
@given(
    proto=st.sampled_from(PROTOCOLS),
    seed=st.integers(0, 2**64 - 1),
    sources=st.integers(1, 3),
    more=st.integers(0, 5),
    back_edges=st.sampled_from([0, 0, 1, 2, 3]),
    tokens=st.integers(0, 40),
    checkpoints=st.integers(1, 5),
    end_of_stream=st.booleans(),
    abort_one_in=st.sampled_from([0, 0, 30, 100]),
)
def test_every_checkpoint_is_a_consistent_cut(
    proto: tuple[str, bool],
    seed: int,
    sources: int,
    more: int,
    back_edges: int,
    tokens: int,
    checkpoints: int,
    end_of_stream: bool,
    abort_one_in: int,
) -> None:
    protocol, aligned_first = proto
    r = run_dataflow(
        protocol,
        seed,
        vertices=sources + more,
        sources=sources,
        back_edges=back_edges,
        tokens_per_source=tokens,
        checkpoints=checkpoints,
        end_of_stream=end_of_stream,
        aligned_first=aligned_first,
        abort_one_in=abort_one_in,
    )
    assert r.violation is None, r.violation
    assert len(r.checkpoints) == checkpoints
    assert all(c.completed or c.aborted for c in r.checkpoints)
    if abort_one_in == 0:
        assert all(c.completed for c in r.checkpoints)


def test_aligned_dag_checkpoints_store_no_channel_state() -> None:
    logged = {"aligned": 0, "unaligned": 0, "chandy-lamport": 0}
    for seed in range(100):
        for protocol in logged:
            r = run_dataflow(protocol, seed, tokens_per_source=60)
            assert r.violation is None
            logged[protocol] += sum(c.logged for c in r.checkpoints)
    assert logged["aligned"] == 0
    assert logged["unaligned"] > 0
    assert logged["chandy-lamport"] > 0


def test_replays_exactly() -> None:
    a = run_dataflow("unaligned", 5, back_edges=2, aligned_first=True)
    assert a == run_dataflow("unaligned", 5, back_edges=2, aligned_first=True)
    assert a != run_dataflow("unaligned", 6, back_edges=2, aligned_first=True)
    assert any(back for _, _, back in a.edges)


def test_bad_configuration_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown protocol"):
        run_dataflow("abs")
    with pytest.raises(ConfigError, match="nothing to simulate"):
        run_dataflow("none")
    with pytest.raises(ConfigError, match="sources <= vertices"):
        run_dataflow("aligned", vertices=2, sources=3)
