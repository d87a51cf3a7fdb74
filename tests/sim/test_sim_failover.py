"""Property test of the failover rule in the simulator (`snapcut.sim.run_failover`):
over random DAGs with several sinks and two task failures, every sink
publishes what a failure-free run publishes, every task's state matches, and
under "upstream" no task outside the failed task's upstream restarts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapcut import ConfigError
from snapcut.sim import FailoverReport, run_failover

PROTOCOLS = ("aligned", "unaligned", "chandy-lamport")


def upstream_of(edges: list[tuple[int, int]], task: int) -> set[int]:
    seen, todo = set(), [task]
    while todo:
        t = todo.pop()
        if t not in seen:
            seen.add(t)
            todo.extend(f for f, to in edges if to == t)
    return seen


@settings(max_examples=150, deadline=None)
@given(
    protocol=st.sampled_from(PROTOCOLS),
    failover=st.sampled_from(("upstream", "region", "full")),
    seed=st.integers(0, 2**32),
    vertices=st.integers(3, 10),
    merge_percent=st.integers(0, 60),
    failures=st.integers(1, 3),
)
def test_every_sink_equals_a_failure_free_run(
    protocol: str, failover: str, seed: int, vertices: int, merge_percent: int, failures: int
) -> None:
    def run(n: int) -> FailoverReport:
        return run_failover(
            protocol,
            failover,
            seed,
            vertices=vertices,
            sources=1 + seed % 2,
            merge_percent=merge_percent,
            failures=n,
        )

    clean, r = run(0), run(failures)
    assert r.violation is None, r.violation
    assert r.published == clean.published
    assert r.counts == clean.counts
    assert len(r.failures) == failures
    for failed, restarted, fallback in r.failures:
        if failover == "full":
            assert restarted == list(range(vertices))
        elif failover == "upstream" and fallback is None:
            assert set(restarted) == upstream_of(r.edges, failed)


def test_without_sequence_numbers_the_property_fails() -> None:
    caught = 0
    for seed in range(30):
        clean = run_failover("aligned", "upstream", seed, failures=0)
        r = run_failover("aligned", "upstream", seed, dedup=False)
        caught += r.published != clean.published or r.counts != clean.counts
    assert caught > 3


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown failover strategy"):
        run_failover("aligned", "regional")
    with pytest.raises(ConfigError, match="not sync"):
        run_failover("sync", "upstream")
    with pytest.raises(ConfigError, match="sources < vertices"):
        run_failover("aligned", "upstream", vertices=2, sources=2)
