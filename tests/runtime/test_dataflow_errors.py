"""Bad jobs fail with a typed error naming the problem, before or while running; never a hang."""

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

import snapcut
from snapcut import Checkpointing, ConfigError, Dataflow, GraphError, TaskError


def small_flow(parallelism: int = 2) -> tuple[Dataflow, snapcut.Stream]:
    flow = Dataflow(parallelism=parallelism)
    return flow, flow.from_batches(pa.table({"k": [1, 2, 3, 4], "v": [10, 20, 30, 40]}))


def test_udf_exception_is_a_task_error_naming_the_operator() -> None:
    def explode(batch: pa.RecordBatch) -> pa.RecordBatch:
        raise ValueError("bad record 42")

    flow, src = small_flow()
    src.map(explode, name="parse").collect("out")
    with pytest.raises(TaskError) as info:
        flow.run(Checkpointing(protocol="aligned", interval=0.01))
    msg = str(info.value)
    assert "'parse'" in msg
    assert "ValueError: bad record 42" in msg
    assert "in explode" in msg, "the Python traceback is carried along"
    assert msg.startswith("task failed: parse-"), msg
    assert msg.count("task failed") == 1, f"the prefix is said once: {msg}"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda s: s.map(lambda b: 42), "expected a pyarrow.RecordBatch or Table, got int"),
        (lambda s: s.filter(lambda b: [True]), "filter mask has 1 values for a batch of"),
        (lambda s: s.filter(lambda b: b["v"]), "must return a boolean mask"),
        (lambda s: s.flat_map(lambda b: 7), "not iterable"),
        (lambda s: s.key_by("k").process(lambda k, b, st: b), "must return a tuple"),
        (lambda s: s.key_by("nope").process(lambda k, b, st: (b, st)), 'key column "nope"'),
        (lambda s: s.key_by("k").process(lambda k, b, st: (None, lambda: 0)), "cannot pickle"),
    ],
)
def test_bad_udf_results_are_task_errors(build: Any, message: str) -> None:
    flow, src = small_flow(parallelism=1)
    build(src).collect("out")
    with pytest.raises(TaskError, match=message):
        flow.run(Checkpointing(protocol="aligned"))


def test_source_exception_is_a_task_error() -> None:
    def rows() -> Any:
        yield {"x": 1}
        raise RuntimeError("upstream went away")

    flow = Dataflow()
    flow.from_iterable(rows, batch_size=1, name="feed").collect("out")
    with pytest.raises(TaskError, match=r"'feed'.*RuntimeError: upstream went away"):
        flow.run()


def test_error_in_a_cycle_does_not_hang() -> None:
    def body(loop: snapcut.Stream) -> tuple[snapcut.Stream, snapcut.Stream]:
        step = loop.map(lambda b: 1 / 0, name="divide")
        return step, step

    flow, src = small_flow()
    flow.iterate(src, body).collect("out")
    with pytest.raises(TaskError, match="ZeroDivisionError"):
        flow.run(Checkpointing(protocol="aligned", interval=0.01))


def test_job_without_sink_is_rejected() -> None:
    flow, src = small_flow()
    src.map(lambda b: b)
    with pytest.raises(GraphError, match="no sink"):
        flow.run()


def test_streams_cannot_cross_flows() -> None:
    _, a = small_flow()
    flow_b, b = small_flow()
    with pytest.raises(GraphError, match="only be used in the Dataflow that made it"):
        flow_b.union(b, a)


def test_duplicate_names_are_rejected() -> None:
    _, src = small_flow()
    src.map(lambda b: b, name="m")
    with pytest.raises(GraphError, match="'m' is used twice"):
        src.map(lambda b: b, name="m")
    src.collect("r")
    with pytest.raises(GraphError, match="collected twice"):
        src.collect("r")


@pytest.mark.parametrize("parallelism", [0, -1, 1.5, True])
def test_bad_parallelism(parallelism: Any) -> None:
    with pytest.raises(ConfigError, match="parallelism must be an int >= 1"):
        Dataflow(parallelism=parallelism)
    _, src = small_flow()
    with pytest.raises(ConfigError, match="parallelism"):
        src.map(lambda b: b, parallelism=parallelism)


@pytest.mark.parametrize("capacity", [0, -3, 2.0, True, "16", None])
def test_bad_channel_capacity(capacity: Any) -> None:
    with pytest.raises(ConfigError, match=r"channel_capacity must be an int >= 1 \(batches"):
        Dataflow(parallelism=2, channel_capacity=capacity)


@pytest.mark.parametrize(
    "specs",
    [{"x": "median"}, {"x": ("avg", "v")}, {"x": ("sum",)}, {"x": ("sum", 3)}, {}],
)
def test_bad_aggregate_specs(specs: dict[str, Any]) -> None:
    _, src = small_flow()
    with pytest.raises(ConfigError, match="aggregate"):
        src.key_by("k").aggregate(**specs)


def test_aggregate_output_equal_to_key_is_rejected_by_rust() -> None:
    flow, src = small_flow()
    src.key_by("k").aggregate(k="count").collect("r")
    with pytest.raises(ConfigError, match="equals the key"):
        flow.run()


def test_run_needs_a_checkpointing_object() -> None:
    flow, src = small_flow()
    src.collect("r")
    with pytest.raises(ConfigError, match=r"must be a snapcut\.Checkpointing"):
        flow.run(checkpointing="aligned")  # type: ignore[arg-type]


def test_bad_generator_arguments() -> None:
    flow = Dataflow()
    with pytest.raises(ConfigError, match="users must be a positive int"):
        flow.generate_dwell_events(users=0, count=10)
    with pytest.raises(ConfigError, match="seed"):
        flow.generate_dwell_events(users=1, count=10, seed=-1)


def test_tuples_need_column_names() -> None:
    flow = Dataflow()
    flow.from_iterable([(1, 2)]).collect("r")
    with pytest.raises(TaskError, match="needs names"):
        flow.run()


@pytest.fixture
def sigint_raises_keyboard_interrupt() -> Iterator[None]:
    # A process started in the background by a shell without job control
    # inherits SIGINT ignored, and Python then leaves it ignored: Ctrl-C (and
    # `_thread.interrupt_main`) would do nothing. The test needs the default.
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_cancels_a_running_job(sigint_raises_keyboard_interrupt: None) -> None:
    # Without cancellation on Ctrl-C, run() would never return: the source is
    # endless in practice, and stops after a minute only so that a regression
    # fails this test instead of hanging the suite.
    import _thread
    import itertools
    import time

    deadline = time.monotonic() + 60

    def endless() -> Any:
        for i in itertools.count():
            if i % 1000 == 0 and time.monotonic() > deadline:
                return
            yield {"x": i}

    def interrupt_once(batch: pa.RecordBatch) -> pa.RecordBatch:
        if batch["x"][0].as_py() == 0:
            _thread.interrupt_main()
        return batch

    flow = Dataflow()
    flow.from_iterable(endless, batch_size=10).map(interrupt_once).collect("r")
    with pytest.raises(KeyboardInterrupt):
        flow.run(Checkpointing(protocol="aligned", interval=0.01))
    assert time.monotonic() < deadline, "cancelled only when the source ran out"


def test_iterate_feedback_must_come_from_the_loop() -> None:
    flow, src = small_flow()
    with pytest.raises(GraphError, match="feedback stream of iterate must be built from the loop"):
        flow.iterate(src, lambda loop: (src, loop.map(lambda b: b)))

    flow, src = small_flow()
    other = flow.from_batches(pa.table({"k": [9], "v": [9]}))

    def step(loop: snapcut.Stream) -> tuple[snapcut.Stream, snapcut.Stream]:
        return other.map(lambda b: b, name="outside"), loop

    flow.iterate(src, step).collect("r")
    with pytest.raises(GraphError, match="does not close a cycle"):
        flow.run()


def test_results_with_mixed_schemas_are_a_clear_error() -> None:
    flow = Dataflow()
    src = flow.from_batches([pa.record_batch({"x": [1]}), pa.record_batch({"x": [2]})])
    src.map(lambda b: b if b["x"][0].as_py() == 1 else pa.record_batch({"y": ["a"]})).collect("r")
    with pytest.raises(TaskError, match='result "r" received batches of different schemas'):
        flow.run()
