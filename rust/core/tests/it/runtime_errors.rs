//! Bad configuration, bad graphs and failing operators give clear typed
//! errors, and a failing job stops cleanly (no hang, no panic).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use snapcut_core::graph::{LogicalGraph, Partitioning};
use snapcut_core::operator::{Batch, Source, SourceFactory};
use snapcut_core::protocol::ProtocolKind;
use snapcut_core::runtime::ops::{
    collect_sink, dwell_source, ipc_file_sink, keyed_aggregate, map_batches, union, AggSpec,
};
use snapcut_core::runtime::{
    CheckpointConfig, CheckpointCounts, InMemorySnapshots, Job, JobOptions,
};
use snapcut_core::Error;

fn pipeline(
    total: u64,
    middle: Arc<dyn snapcut_core::operator::OperatorFactory>,
    key: &str,
) -> LogicalGraph {
    let mut g = LogicalGraph::new();
    let s = g.add_source("src", 2, dwell_source(total, 10, 1, 256).unwrap());
    let m = g.add_operator("map", 2, middle);
    let (sink, _) = collect_sink();
    let k = g.add_operator("sink", 1, sink);
    g.connect(s, m, Partitioning::Hash { key: key.into() });
    g.connect(m, k, Partitioning::RoundRobin);
    g
}

fn aligned(interval_ms: u64) -> CheckpointConfig {
    CheckpointConfig {
        interval: Some(Duration::from_millis(interval_ms)),
        ..Default::default()
    }
}

#[test]
fn config_errors_are_typed_and_named() {
    let g = || pipeline(10, union(), "user");
    let bad = [
        (
            CheckpointConfig {
                interval: Some(Duration::ZERO),
                ..Default::default()
            },
            JobOptions::default(),
            "interval",
        ),
        (
            CheckpointConfig {
                protocol: ProtocolKind::Unaligned,
                max_concurrent: 2,
                ..Default::default()
            },
            JobOptions::default(),
            "max_concurrent",
        ),
        (
            CheckpointConfig::default(),
            JobOptions {
                channel_capacity: 0,
                ..Default::default()
            },
            "channel_capacity",
        ),
        (
            CheckpointConfig {
                protocol: ProtocolKind::Aligned,
                alignment_timeout: Duration::from_millis(5),
                ..Default::default()
            },
            JobOptions::default(),
            "alignment_timeout",
        ),
    ];
    for (config, options, word) in bad {
        match Job::new(g(), config, options) {
            Err(Error::Config(msg)) => assert!(msg.contains(word), "{msg}"),
            Err(other) => panic!("expected a config error naming {word}, got {other}"),
            Ok(_) => panic!("expected a config error naming {word}"),
        }
    }
    assert!(keyed_aggregate("k", vec![]).is_err());
    assert!(dwell_source(1, 0, 1, 1).is_err());
}

#[test]
fn graph_errors_surface_from_job_new() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("src", 2, dwell_source(10, 10, 1, 4).unwrap());
    let a = g.add_operator("a", 3, union());
    g.connect(s, a, Partitioning::Forward);
    match Job::new(g, CheckpointConfig::default(), JobOptions::default()) {
        Err(Error::Graph(msg)) => assert!(msg.contains("forward edge"), "{msg}"),
        Err(other) => panic!("expected a graph error, got {other}"),
        Ok(_) => panic!("expected a graph error"),
    }
}

#[test]
fn failing_operator_stops_the_job_with_a_task_error_naming_it() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let failing = map_batches(move |b| {
        if c.fetch_add(1, Ordering::SeqCst) == 50 {
            return Err(Error::Task("division by zero in user function".into()));
        }
        Ok(Some(b))
    });
    let job = Job::new(
        pipeline(10_000_000, failing, "user"),
        aligned(5),
        JobOptions {
            channel_capacity: 4,
            ..Default::default()
        },
    )
    .unwrap();
    match job.run(Arc::new(InMemorySnapshots::new())) {
        Err(Error::Task(msg)) => {
            assert!(msg.contains("division by zero"), "{msg}");
            assert!(msg.starts_with("map-"), "the message names the task: {msg}");
        }
        other => panic!("expected a task error, got {other:?}"),
    }
}

#[test]
fn panicking_operator_is_reported_not_propagated() {
    let panicky = map_batches(|b: Batch| {
        let first = b.column(0).as_primitive::<Int64Type>().value(0);
        if first >= 0 {
            panic!("boom in user code");
        }
        Ok(Some(b))
    });
    let job = Job::new(
        pipeline(1_000_000, panicky, "user"),
        aligned(5),
        JobOptions::default(),
    )
    .unwrap();
    match job.run(Arc::new(InMemorySnapshots::new())) {
        Err(Error::Task(msg)) => assert!(msg.contains("panicked: boom in user code"), "{msg}"),
        other => panic!("expected a task error, got {other:?}"),
    }
}

#[test]
fn missing_hash_key_column_is_a_clear_task_error() {
    let job = Job::new(
        pipeline(10_000, union(), "no_such_column"),
        CheckpointConfig::default(),
        JobOptions::default(),
    )
    .unwrap();
    match job.run(Arc::new(InMemorySnapshots::new())) {
        Err(Error::Task(msg)) => assert!(
            msg.contains("\"no_such_column\" is not in the batch"),
            "{msg}"
        ),
        other => panic!("expected a task error, got {other:?}"),
    }
}

/// A source that never ends (emits small batches forever).
struct Endless(Box<dyn Source>);
impl Source for Endless {
    fn next_batch(&mut self) -> snapcut_core::Result<Option<Batch>> {
        std::thread::sleep(Duration::from_millis(1));
        match self.0.next_batch()? {
            Some(b) => Ok(Some(b)),
            None => {
                self.0.seek(0)?;
                self.0.next_batch()
            }
        }
    }
    fn offset(&self) -> u64 {
        self.0.offset()
    }
    fn seek(&mut self, o: u64) -> snapcut_core::Result<()> {
        self.0.seek(o)
    }
}
struct EndlessFactory;
impl SourceFactory for EndlessFactory {
    fn create(&self, s: usize, p: usize) -> snapcut_core::Result<Box<dyn Source>> {
        Ok(Box::new(Endless(
            dwell_source(1000, 10, 3, 100)?.create(s, p)?,
        )))
    }
}

#[test]
fn handle_triggers_savepoints_and_cancels() {
    let mut g = LogicalGraph::new();
    let s = g.add_source("src", 2, Arc::new(EndlessFactory));
    let a = g.add_operator(
        "agg",
        2,
        keyed_aggregate("user", vec![AggSpec::sum("dwell_ms", "t")]).unwrap(),
    );
    g.connect(s, a, Partitioning::Hash { key: "user".into() });
    // No interval: only manual checkpoints.
    let job = Job::new(g, CheckpointConfig::default(), JobOptions::default()).unwrap();
    let handle = job.handle();
    let snaps = Arc::new(InMemorySnapshots::new());
    let s2 = snaps.clone();
    let runner = std::thread::spawn(move || job.run(s2));
    assert_eq!(handle.checkpoints(), CheckpointCounts::default());
    handle.trigger_savepoint().unwrap();
    handle.trigger_checkpoint().unwrap();
    // Wait (bounded) for both to complete, as the handle counts them, then cancel.
    for _ in 0..2000 {
        if handle.checkpoints().completed >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let counts = handle.checkpoints();
    assert_eq!(
        (counts.started, counts.completed, counts.aborted),
        (2, 2, 0)
    );
    assert_eq!(counts.in_flight(), 0);
    assert_eq!(
        snaps.completed().len(),
        2,
        "counted complete only once committed"
    );
    handle.cancel().unwrap();
    match runner.join().unwrap() {
        Err(Error::Task(msg)) => assert!(msg.contains("cancelled by the user"), "{msg}"),
        other => panic!("expected cancellation, got {other:?}"),
    }
    let completed = snaps.completed();
    assert_eq!(completed.len(), 2);
    assert!(completed[0].meta.savepoint && !completed[1].meta.savepoint);
    assert_eq!(completed[0].tasks.len(), 4);
    assert!(handle.trigger_checkpoint().is_err(), "the job has ended");
}

#[test]
fn ipc_file_sink_writes_one_readable_file_per_subtask() {
    let dir = std::env::temp_dir().join(format!("snapcut-ipc-sink-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut g = LogicalGraph::new();
    let s = g.add_source("src", 2, dwell_source(5000, 10, 1, 512).unwrap());
    let k = g.add_operator("out", 2, ipc_file_sink(&dir).unwrap());
    g.connect(s, k, Partitioning::Forward);
    let report = Job::new(g, aligned(5), JobOptions::default())
        .unwrap()
        .run(Arc::new(InMemorySnapshots::new()))
        .unwrap();
    assert_eq!(report.records_out, 5000);
    let mut rows = 0;
    // Committed files are `part-<subtask>-<checkpoint>.arrow` (two-phase commit).
    let mut subtasks = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            name.starts_with("part-") && name.ends_with(".arrow"),
            "{name}"
        );
        subtasks.insert(name.split('-').nth(1).unwrap().to_string());
        let f = std::fs::File::open(dir.join(&name)).unwrap();
        let reader = arrow_ipc::reader::FileReader::try_new(f, None).unwrap();
        rows += reader.map(|b| b.unwrap().num_rows()).sum::<usize>();
    }
    assert_eq!(subtasks.len(), 2, "both subtasks wrote");
    assert_eq!(rows, 5000);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Passes batches through; its snapshot takes 30 ms (longer than the
/// checkpoint timeout used below).
struct SlowSnapshot;
impl snapcut_core::operator::Operator for SlowSnapshot {
    fn process(
        &mut self,
        _input: usize,
        batch: Batch,
        out: &mut dyn snapcut_core::operator::Emitter,
    ) -> snapcut_core::Result<()> {
        out.emit(batch)
    }
    fn snapshot(
        &mut self,
        _id: u64,
    ) -> snapcut_core::Result<Option<snapcut_core::snapshot::StateCapture>> {
        std::thread::sleep(Duration::from_millis(30));
        Ok(None)
    }
}

fn slow_snapshot_job(tolerable_failures: u32) -> (Job, snapcut_core::runtime::ops::Collected) {
    let mut g = LogicalGraph::new();
    let s = g.add_source("src", 2, Arc::new(EndlessOnce));
    let m = g.add_operator(
        "slow",
        2,
        Arc::new(
            |_: usize,
             _: usize|
             -> snapcut_core::Result<Box<dyn snapcut_core::operator::Operator>> {
                Ok(Box::new(SlowSnapshot))
            },
        ),
    );
    let (sink, out) = collect_sink();
    let k = g.add_operator("sink", 1, sink);
    g.connect(s, m, Partitioning::Forward);
    g.connect(m, k, Partitioning::RoundRobin);
    let config = CheckpointConfig {
        interval: Some(Duration::from_millis(5)),
        timeout: Duration::from_millis(1),
        tolerable_failures,
        ..Default::default()
    };
    (Job::new(g, config, JobOptions::default()).unwrap(), out)
}

/// 200 batches of 100 records, 1 ms apart, then the end.
struct EndlessOnce;
impl SourceFactory for EndlessOnce {
    fn create(&self, s: usize, p: usize) -> snapcut_core::Result<Box<dyn Source>> {
        struct Paced(Box<dyn Source>);
        impl Source for Paced {
            fn next_batch(&mut self) -> snapcut_core::Result<Option<Batch>> {
                std::thread::sleep(Duration::from_millis(1));
                self.0.next_batch()
            }
            fn offset(&self) -> u64 {
                self.0.offset()
            }
            fn seek(&mut self, o: u64) -> snapcut_core::Result<()> {
                self.0.seek(o)
            }
        }
        Ok(Box::new(Paced(
            dwell_source(40_000, 10, 3, 100)?.create(s, p)?,
        )))
    }
}

#[test]
fn expired_checkpoint_fails_the_job_when_no_failure_is_tolerated() {
    let (job, _) = slow_snapshot_job(0);
    let snaps = Arc::new(InMemorySnapshots::new());
    match job.run(snaps.clone()) {
        Err(Error::Snapshot(msg)) => {
            assert!(
                msg.contains("expired") && msg.contains("tolerable_failures = 0"),
                "{msg}"
            )
        }
        other => panic!("expected a snapshot error, got {other:?}"),
    }
    assert!(snaps.completed().is_empty());
    assert!(!snaps.aborted().is_empty());
}

#[test]
fn tolerated_expired_checkpoints_are_aborted_and_the_job_finishes() {
    let (job, out) = slow_snapshot_job(1_000_000);
    let handle = job.handle();
    let snaps = Arc::new(InMemorySnapshots::new());
    let report = job.run(snaps.clone()).unwrap();
    let counts = handle.checkpoints();
    assert_eq!(counts.completed, 0);
    assert_eq!(counts.aborted as usize, report.checkpoints.len());
    assert_eq!(counts.in_flight(), 0, "{counts:?}");
    assert_eq!(out.num_rows(), 40_000);
    assert!(snaps.completed().is_empty());
    let aborted: Vec<_> = report
        .checkpoints
        .iter()
        .filter(|c| matches!(&c.status, snapcut_core::runtime::CheckpointStatus::Aborted(r) if r.contains("expired")))
        .collect();
    assert!(aborted.len() >= 2, "{:?}", report.checkpoints);
    let all_aborted = report
        .checkpoints
        .iter()
        .filter(|c| c.status != snapcut_core::runtime::CheckpointStatus::Completed)
        .count();
    assert_eq!(all_aborted, snaps.aborted().len());
}

#[test]
fn triggering_without_a_protocol_is_a_config_error() {
    let config = CheckpointConfig {
        protocol: ProtocolKind::None,
        ..Default::default()
    };
    let job = Job::new(pipeline(10, union(), "user"), config, JobOptions::default()).unwrap();
    match job.handle().trigger_savepoint() {
        Err(Error::Config(msg)) => assert!(msg.contains("protocol 'none'"), "{msg}"),
        other => panic!("expected a config error, got {other:?}"),
    }
}
