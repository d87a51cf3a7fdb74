//! The DESIGN.md dwell-time job (generated source → hash by user → per-user
//! count/total/mean → sink) under every protocol: same answer as a plain
//! loop, and every checkpoint is a consistent cut.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::RecordBatch;
use snapcut_core::graph::{LogicalGraph, Partitioning};
use snapcut_core::operator::{Batch, Source, SourceFactory};
use snapcut_core::protocol::ProtocolKind;
use snapcut_core::runtime::ops::{
    collect_sink, dwell_record, keyed_aggregate, AggSpec, Collected, DwellSource,
};
use snapcut_core::runtime::{
    CheckpointConfig, CheckpointStatus, InMemorySnapshots, Job, JobOptions, JobReport,
};
use snapcut_core::snapshot::CompletedCheckpoint;

const SEED: u64 = 42;
const USERS: u64 = 97;
const TOTAL: u64 = 300_000;
const BATCH: usize = 1024;

/// The generator, slowed down by a sleep per batch so that periodic
/// checkpoints fall in the middle of the stream.
struct Slow(DwellSource, Duration);

impl Source for Slow {
    fn next_batch(&mut self) -> snapcut_core::Result<Option<Batch>> {
        std::thread::sleep(self.1);
        self.0.next_batch()
    }
    fn offset(&self) -> u64 {
        self.0.offset()
    }
    fn seek(&mut self, offset: u64) -> snapcut_core::Result<()> {
        self.0.seek(offset)
    }
}

struct SlowFactory;

impl SourceFactory for SlowFactory {
    fn create(&self, subtask: usize, parallelism: usize) -> snapcut_core::Result<Box<dyn Source>> {
        Ok(Box::new(Slow(
            DwellSource::new(TOTAL, USERS, SEED, BATCH, subtask, parallelism),
            Duration::from_millis(2),
        )))
    }
}

fn reference(records: impl Iterator<Item = u64>) -> BTreeMap<i64, (i64, i64)> {
    let mut m = BTreeMap::new();
    for i in records {
        let (u, d) = dwell_record(SEED, i, USERS);
        let e = m.entry(u).or_insert((0, 0));
        e.0 += 1;
        e.1 += d;
    }
    m
}

fn dwell_graph(p: usize) -> (LogicalGraph, Collected) {
    let mut g = LogicalGraph::new();
    let src = g.add_source("src", p, Arc::new(SlowFactory));
    let agg = g.add_operator(
        "agg",
        p,
        keyed_aggregate(
            "user",
            vec![
                AggSpec::count("dwell_ms", "n"),
                AggSpec::sum("dwell_ms", "total"),
                AggSpec::mean("dwell_ms", "avg"),
            ],
        )
        .unwrap(),
    );
    let (sink_factory, collected) = collect_sink();
    let sink = g.add_operator("sink", 1, sink_factory);
    g.connect(src, agg, Partitioning::Hash { key: "user".into() });
    g.connect(agg, sink, Partitioning::RoundRobin);
    (g, collected)
}

fn results(batches: &[RecordBatch]) -> BTreeMap<i64, (i64, i64, f64)> {
    let mut m = BTreeMap::new();
    for b in batches {
        let u = b
            .column_by_name("user")
            .unwrap()
            .as_primitive::<Int64Type>();
        let n = b.column_by_name("n").unwrap().as_primitive::<Int64Type>();
        let t = b
            .column_by_name("total")
            .unwrap()
            .as_primitive::<Int64Type>();
        let a = b
            .column_by_name("avg")
            .unwrap()
            .as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            assert!(
                m.insert(u.value(i), (n.value(i), t.value(i), a.value(i)))
                    .is_none(),
                "user twice"
            );
        }
    }
    m
}

/// Per-user (count, total) in a checkpoint: aggregator states plus every
/// record logged in flight on the aggregators' inputs.
fn checkpoint_contents(c: &CompletedCheckpoint) -> BTreeMap<i64, (i64, i64)> {
    let mut m: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for (task, snap) in &c.tasks {
        if task.vertex != "agg" {
            continue;
        }
        if let Some(state) = &snap.state {
            let b = &state.batch;
            let u = b
                .column_by_name("user")
                .unwrap()
                .as_primitive::<Int64Type>();
            let n = b.column_by_name("n").unwrap().as_primitive::<Int64Type>();
            let t = b
                .column_by_name("total")
                .unwrap()
                .as_primitive::<Int64Type>();
            for i in 0..b.num_rows() {
                let e = m.entry(u.value(i)).or_default();
                e.0 += n.value(i);
                e.1 += t.value(i);
            }
        }
        for log in &snap.channels {
            assert_eq!(log.edge, "agg<-src");
            for b in &log.records {
                let u = b
                    .column_by_name("user")
                    .unwrap()
                    .as_primitive::<Int64Type>();
                let d = b
                    .column_by_name("dwell_ms")
                    .unwrap()
                    .as_primitive::<Int64Type>();
                for i in 0..b.num_rows() {
                    let e = m.entry(u.value(i)).or_default();
                    e.0 += 1;
                    e.1 += d.value(i);
                }
            }
        }
    }
    m
}

/// Records the sources had emitted before the barrier: subtask s of p with
/// offset o emitted global records s, s+p, ..., s+(o-1)p.
fn records_before(c: &CompletedCheckpoint, p: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for (task, snap) in &c.tasks {
        if task.vertex == "src" {
            let o = snap.source_offset.expect("sources record an offset");
            out.extend((0..o).map(|k| task.subtask as u64 + k * p));
        }
    }
    out
}

fn run_dwell(
    protocol: ProtocolKind,
    p: usize,
    config: CheckpointConfig,
) -> (JobReport, Collected, Arc<InMemorySnapshots>) {
    let (g, collected) = dwell_graph(p);
    let config = CheckpointConfig { protocol, ..config };
    let job = Job::new(g, config, JobOptions::default()).unwrap();
    let snaps = Arc::new(InMemorySnapshots::new());
    let report = job.run(snaps.clone()).unwrap();
    (report, collected, snaps)
}

fn check_protocol(protocol: ProtocolKind, config: CheckpointConfig) {
    let p = 2;
    let (report, collected, snaps) = run_dwell(
        protocol,
        p,
        CheckpointConfig {
            interval: config.interval.or(Some(Duration::from_millis(15))),
            ..config
        },
    );
    // Same answer as a plain loop.
    let want = reference(0..TOTAL);
    let got = results(&collected.batches());
    assert_eq!(got.len(), want.len());
    for (u, (n, t)) in &want {
        let (gn, gt, ga) = got[u];
        assert_eq!((gn, gt), (*n, *t), "user {u}");
        assert!((ga - *t as f64 / *n as f64).abs() < 1e-9);
    }
    assert_eq!(report.records_in, TOTAL);
    assert_eq!(report.records_out, want.len() as u64);

    // Several checkpoints, each a consistent cut.
    let completed = snaps.completed();
    assert!(
        completed.len() >= 3,
        "{protocol}: only {} checkpoints completed",
        completed.len()
    );
    assert_eq!(report.completed_checkpoints().count(), completed.len());
    assert!(report.checkpoints.last().unwrap().is_final);
    let mut mid_stream = 0;
    for c in &completed {
        assert_eq!(c.meta.protocol, protocol);
        assert_eq!(c.tasks.len(), 2 * p + 1, "every task reports");
        let before = records_before(c, p as u64);
        if (before.len() as u64) < TOTAL {
            mid_stream += 1;
        }
        assert_eq!(
            checkpoint_contents(c),
            reference(before.into_iter()),
            "{protocol} checkpoint {}",
            c.meta.id
        );
        if matches!(
            protocol,
            ProtocolKind::Aligned | ProtocolKind::Sync | ProtocolKind::SyncCapture
        ) {
            assert!(
                c.tasks.values().all(|t| t.channels.is_empty()),
                "aligned checkpoints store no channel state"
            );
        }
    }
    assert!(
        mid_stream >= 2,
        "{protocol}: {mid_stream} checkpoints fell mid-stream"
    );
    for m in report.completed_checkpoints() {
        assert_eq!(m.status, CheckpointStatus::Completed);
        assert_eq!(m.alignment.len(), 2 * p + 1);
    }
}

#[test]
fn aligned_dwell_job_is_exact_and_consistent() {
    check_protocol(ProtocolKind::Aligned, CheckpointConfig::default());
}

#[test]
fn unaligned_dwell_job_is_exact_and_consistent() {
    check_protocol(ProtocolKind::Unaligned, CheckpointConfig::default());
}

#[test]
fn unaligned_with_alignment_timeout_is_exact_and_consistent() {
    check_protocol(
        ProtocolKind::Unaligned,
        CheckpointConfig {
            alignment_timeout: Duration::from_millis(1),
            ..Default::default()
        },
    );
}

#[test]
fn chandy_lamport_dwell_job_is_exact_and_consistent() {
    check_protocol(ProtocolKind::ChandyLamport, CheckpointConfig::default());
}

#[test]
fn sync_dwell_job_is_exact_and_consistent() {
    check_protocol(ProtocolKind::Sync, CheckpointConfig::default());
}

#[test]
fn sync_capture_dwell_job_is_exact_and_consistent() {
    check_protocol(ProtocolKind::SyncCapture, CheckpointConfig::default());
}

#[test]
fn aligned_with_concurrent_checkpoints_is_consistent() {
    check_protocol(
        ProtocolKind::Aligned,
        CheckpointConfig {
            max_concurrent: 3,
            interval: Some(Duration::from_millis(4)),
            ..Default::default()
        },
    );
}

#[test]
fn no_checkpoints_gives_the_same_answer() {
    let (report, collected, snaps) = run_dwell(
        ProtocolKind::None,
        3,
        CheckpointConfig {
            interval: Some(Duration::from_millis(5)),
            ..Default::default()
        },
    );
    let want = reference(0..TOTAL);
    let got = results(&collected.batches());
    assert_eq!(got.len(), want.len());
    for (u, (n, t)) in &want {
        assert_eq!((got[u].0, got[u].1), (*n, *t));
    }
    assert!(snaps.completed().is_empty());
    assert!(report.checkpoints.is_empty());
}

/// Restoring a mid-stream checkpoint and running to the end gives the same
/// answer as a run that never stopped (exactly-once state).
fn restore_mid_stream(protocol: ProtocolKind) {
    let p = 2;
    let (_, _, snaps) = run_dwell(
        protocol,
        p,
        CheckpointConfig {
            interval: Some(Duration::from_millis(15)),
            ..Default::default()
        },
    );
    let completed = snaps.completed();
    let mid: Vec<&CompletedCheckpoint> = completed
        .iter()
        .filter(|c| (records_before(c, p as u64).len() as u64) < TOTAL / 2)
        .collect();
    let chosen = mid
        .last()
        .expect("a checkpoint in the first half of the stream");
    let (g, collected) = dwell_graph(p);
    let job = Job::new(
        g,
        CheckpointConfig {
            protocol,
            ..Default::default()
        },
        JobOptions::default(),
    )
    .unwrap()
    .restore_from(chosen)
    .unwrap();
    let report = job.run(Arc::new(InMemorySnapshots::new())).unwrap();
    assert_eq!(
        report.records_in,
        TOTAL - records_before(chosen, p as u64).len() as u64
    );
    let want = reference(0..TOTAL);
    let got = results(&collected.batches());
    assert_eq!(got.len(), want.len());
    for (u, (n, t)) in &want {
        assert_eq!((got[u].0, got[u].1), (*n, *t), "{protocol}: user {u}");
    }
    // Checkpoint ids continue after the restored one.
    assert!(report.checkpoints.iter().all(|c| c.id > chosen.meta.id));
}

#[test]
fn aligned_checkpoint_restores_exactly_once() {
    restore_mid_stream(ProtocolKind::Aligned);
}

#[test]
fn unaligned_checkpoint_restores_exactly_once() {
    restore_mid_stream(ProtocolKind::Unaligned);
}

#[test]
fn chandy_lamport_checkpoint_restores_exactly_once() {
    restore_mid_stream(ProtocolKind::ChandyLamport);
}

#[test]
fn restoring_into_another_graph_shape_is_refused() {
    let (_, _, snaps) = run_dwell(ProtocolKind::Aligned, 2, CheckpointConfig::default());
    let last = snaps.latest().expect("the final checkpoint");
    let (g, _) = dwell_graph(3);
    match Job::new(g, CheckpointConfig::default(), JobOptions::default())
        .unwrap()
        .restore_from(&last)
    {
        Err(snapcut_core::Error::Snapshot(msg)) => {
            assert!(msg.contains("same vertices, parallelism"), "{msg}")
        }
        Err(e) => panic!("expected a snapshot error, got {e}"),
        Ok(_) => panic!("expected a snapshot error"),
    }
}

#[test]
fn chandy_lamport_with_concurrent_snapshots_is_consistent() {
    check_protocol(
        ProtocolKind::ChandyLamport,
        CheckpointConfig {
            max_concurrent: 3,
            interval: Some(Duration::from_millis(4)),
            ..Default::default()
        },
    );
}
