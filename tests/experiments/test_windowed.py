"""The windowed estimator (snapcut.experiments.windowed) recovers a known
slowdown: on a synthetic timeline with drift and noise, and on a real job
whose operator sleeps longer per batch in on windows (switched by the same
Trigger that switches checkpoints)."""

from __future__ import annotations

import random
import statistics
import threading
import time

import pyarrow as pa
import pytest

from snapcut import Checkpointing
from snapcut.dataflow import Dataflow, JobControl
from snapcut.experiments.windowed import (
    Trigger,
    clustered_median_ci,
    on_overheads,
    window_rates,
)

BUCKET_S, WINDOW_S, GUARD_S, WARMUP_S = 0.05, 0.5, 0.1, 0.5


def synthetic(windows: int, slowdown: float, seed: int) -> list[int]:
    """Records per 50 ms bucket: a rate drifting up 40 % over the run, ±3 %
    noise, and on windows (odd) slower by `slowdown`."""
    rng = random.Random(seed)
    per = round(WINDOW_S / BUCKET_S)
    first = round(WARMUP_S / BUCKET_S)
    n = first + per * windows
    out = []
    for i in range(n):
        rate = 1000.0 * (1 + 0.4 * i / n) * rng.uniform(0.97, 1.03)
        w = (i - first) // per
        if i >= first and w % 2 == 1:
            rate /= 1 + slowdown
        out.append(round(rate))
    return out


def estimate(counts: list[int]) -> tuple[float, float, float]:
    rates = window_rates(counts, BUCKET_S, WINDOW_S, GUARD_S, WARMUP_S)
    overheads = on_overheads(rates)
    lo, hi = clustered_median_ci([overheads])
    return lo, statistics.median(overheads), hi


def test_a_synthetic_slowdown_is_recovered_despite_drift() -> None:
    for truth in (0.0, 0.05, 0.2):
        lo, mid, hi = estimate(synthetic(41, truth, seed=3))
        assert lo <= truth <= hi, (truth, lo, mid, hi)
        assert hi - lo < 0.04
    # The drift alone would read as an effect if windows were not paired with neighbours.
    counts = synthetic(41, 0.0, seed=4)
    rates = window_rates(counts, BUCKET_S, WINDOW_S, GUARD_S, WARMUP_S)
    assert rates[-1] / rates[0] > 1.3


SLEEP_OFF_S, SLEEP_ON_S = 0.004, 0.006
BATCH = 256


# Timed windows of a real job: at nice 10 beside CI's Spark streams the off
# windows' rate misjudged the batch's own time (fresh-clone check 2026-12-04:
# truth 0.338 against an interval of [0.236, 0.264]); the priority stream runs it.
@pytest.mark.full_priority
def test_a_slowdown_injected_in_on_windows_of_a_real_job_is_recovered() -> None:
    """A map sleeps 4 ms per batch in off windows and 6 ms in on windows:
    the injected slowdown is (6 + c) / (4 + c) - 1 for a batch's own time c,
    which the off windows' rate gives (c = batch / rate - 4 ms): about +43 %."""
    on = threading.Event()

    def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(SLEEP_ON_S if on.is_set() else SLEEP_OFF_S)
        return batch

    records = 360_000  # about 7 s: ~14 windows
    flow = Dataflow(parallelism=1)
    src = flow.generate_dwell_events(users=1000, count=records, seed=1, batch_size=BATCH)
    src.map(slow, name="slow").key_by("user").aggregate(name="measured", count="count").collect(
        "result"
    )
    control = JobControl()

    def switch(state: bool) -> None:
        (on.set if state else on.clear)()

    trigger = Trigger(control, WINDOW_S, GUARD_S, None, WARMUP_S, switch=switch)
    trigger.start()
    # Bounded: a job still running after 60 s is cancelled (and the test fails).
    stopper = threading.Timer(60.0, control.cancel)
    stopper.start()
    try:
        report = flow.run(Checkpointing(protocol="none"), control=control)
    except Exception:
        report = None  # cancelled: the timeline of a cancelled run is not returned
    finally:
        stopper.cancel()
        trigger.stop.set()
        trigger.join()
    assert report is not None, "the job did not finish its records before the stop"
    rates = window_rates(
        report.timeline["measured"], report.timeline_bucket_s, WINDOW_S, GUARD_S, WARMUP_S
    )
    assert len(rates) >= 9
    overheads = on_overheads(rates)
    lo, hi = clustered_median_ci([overheads])
    own_s = BATCH / statistics.median(rates[0::2]) - SLEEP_OFF_S
    truth = (SLEEP_ON_S + own_s) / (SLEEP_OFF_S + own_s) - 1
    # 2 / (4 ms + c): ~0.43 on a quiet machine; under CI's load c grows (fresh29:
    # 0.29, c = 2.8 ms), and the measured overhead with it, which is what is checked.
    assert 0.2 < truth <= 0.5
    # `truth` leans on c estimated from the off windows (sleep overshoot and
    # channel hand-offs included): known to about two points on a quiet
    # machine, four under load (a CI check at load ~12 gave truth 0.400
    # against an interval of [0.428, 0.491]).
    assert lo - 0.04 <= truth <= hi + 0.04, (lo, statistics.median(overheads), hi, truth)
    assert lo > 0.1
