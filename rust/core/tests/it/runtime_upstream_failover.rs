//! `upstream` failover (SeaTunnel's regional failover): a failed task
//! restarts with its upstream closure only; the tasks downstream of that set
//! keep running (no restart, no lost state) and drop the records the
//! restarted upstream replays, by per-channel sequence number. Every sink's
//! output equals a failure-free run, on every snapshot protocol.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::RecordBatch;
use snapcut_core::graph::{LogicalGraph, Partitioning};
use snapcut_core::operator::{Batch, Emitter, Operator, OperatorFactory};
use snapcut_core::protocol::{CheckpointId, InputId, ProtocolKind};
use snapcut_core::runtime::ops::{
    collect_sink, dwell_record, dwell_source, keyed_aggregate, keyed_aggregate_forwarding, AggSpec,
    Collected,
};
use snapcut_core::runtime::{
    run_durable, CheckpointConfig, DurableOptions, FailoverStrategy, InMemorySnapshots, Job,
    JobOptions, JobReport, RestartScope, RestartStrategy,
};

const USERS: u64 = 30;
const COUNT: u64 = 30_000;
const BATCH: usize = 100;
const SEED: u64 = 11;

/// Counts the operators a factory makes: each (re)start of a subtask makes one.
struct Counted {
    inner: Arc<dyn OperatorFactory>,
    made: Arc<AtomicUsize>,
}

impl OperatorFactory for Counted {
    fn create(
        &self,
        subtask: usize,
        parallelism: usize,
    ) -> snapcut_core::Result<Box<dyn Operator>> {
        self.made.fetch_add(1, Ordering::SeqCst);
        self.inner.create(subtask, parallelism)
    }
}

fn counted(inner: Arc<dyn OperatorFactory>) -> (Arc<dyn OperatorFactory>, Arc<AtomicUsize>) {
    let made = Arc::new(AtomicUsize::new(0));
    (
        Arc::new(Counted {
            inner,
            made: made.clone(),
        }),
        made,
    )
}

/// Passes batches on slowly; subtask 0 fails once on its first batch after
/// a checkpoint it took part in committed.
struct FailOnce {
    armed: Arc<AtomicBool>,
    fails: bool,
    committed: bool,
}

impl Operator for FailOnce {
    fn process(
        &mut self,
        _i: InputId,
        batch: Batch,
        out: &mut dyn Emitter,
    ) -> snapcut_core::Result<()> {
        std::thread::sleep(Duration::from_micros(if self.committed {
            300
        } else {
            1_500
        }));
        if self.fails && self.committed && self.armed.swap(false, Ordering::SeqCst) {
            return Err(snapcut_core::Error::Task("injected failure".into()));
        }
        out.emit(batch)
    }
    fn commit(&mut self, _id: CheckpointId) -> snapcut_core::Result<()> {
        self.committed = true;
        Ok(())
    }
}

/// The fan-out job: `src` (1) → `stage` (2, keyed state, hash) → three
/// branches: `fail` (2, forward) → `sink_a` (2, forward); `sink_b` (2,
/// forward); `agg_c` (2, keyed counts, hash) → `sink_c` (1).
struct FanOut {
    graph: LogicalGraph,
    a: Collected,
    b: Collected,
    c: Collected,
    made: BTreeMap<&'static str, Arc<AtomicUsize>>,
    armed: Arc<AtomicBool>,
}

fn fan_out() -> FanOut {
    let armed = Arc::new(AtomicBool::new(true));
    let mut g = LogicalGraph::new();
    let mut made = BTreeMap::new();
    let src = g.add_source("src", 1, dwell_source(COUNT, USERS, SEED, BATCH).unwrap());
    let (stage, n) =
        counted(keyed_aggregate_forwarding("user", vec![AggSpec::count("dwell_ms", "n")]).unwrap());
    made.insert("stage", n);
    let stage = g.add_operator("stage", 2, stage);
    g.connect(src, stage, Partitioning::Hash { key: "user".into() });
    let a_armed = armed.clone();
    let fail: Arc<dyn OperatorFactory> = Arc::new(
        move |subtask: usize, _: usize| -> snapcut_core::Result<Box<dyn Operator>> {
            Ok(Box::new(FailOnce {
                armed: a_armed.clone(),
                fails: subtask == 0,
                committed: false,
            }))
        },
    );
    let (fail, n) = counted(fail);
    made.insert("fail", n);
    let fail = g.add_operator("fail", 2, fail);
    g.connect(stage, fail, Partitioning::Forward);
    let sink = |name: &'static str,
                g: &mut LogicalGraph,
                made: &mut BTreeMap<&'static str, Arc<AtomicUsize>>,
                par: usize| {
        let (factory, out) = collect_sink();
        let (factory, n) = counted(factory);
        made.insert(name, n);
        (g.add_operator(name, par, factory), out)
    };
    let (sink_a, a) = sink("sink_a", &mut g, &mut made, 2);
    g.connect(fail, sink_a, Partitioning::Forward);
    let (sink_b, b) = sink("sink_b", &mut g, &mut made, 2);
    g.connect(stage, sink_b, Partitioning::Forward);
    let (agg_c, n) =
        counted(keyed_aggregate("user", vec![AggSpec::count("dwell_ms", "n")]).unwrap());
    made.insert("agg_c", n);
    let agg_c = g.add_operator("agg_c", 2, agg_c);
    g.connect(stage, agg_c, Partitioning::Hash { key: "user".into() });
    let (sink_c, c) = sink("sink_c", &mut g, &mut made, 1);
    g.connect(agg_c, sink_c, Partitioning::Hash { key: "user".into() });
    FanOut {
        graph: g,
        a,
        b,
        c,
        made,
        armed,
    }
}

/// Every source record once, as (user, dwell_ms) counts.
fn expected_records() -> BTreeMap<(i64, i64), usize> {
    let mut m = BTreeMap::new();
    for i in 0..COUNT {
        *m.entry(dwell_record(SEED, i, USERS)).or_insert(0) += 1;
    }
    m
}

fn records(batches: &[RecordBatch]) -> BTreeMap<(i64, i64), usize> {
    let mut m = BTreeMap::new();
    for b in batches {
        let u = b
            .column_by_name("user")
            .unwrap()
            .as_primitive::<Int64Type>();
        let d = b
            .column_by_name("dwell_ms")
            .unwrap()
            .as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            *m.entry((u.value(i), d.value(i))).or_insert(0) += 1;
        }
    }
    m
}

fn user_counts(batches: &[RecordBatch]) -> BTreeMap<i64, i64> {
    let mut m = BTreeMap::new();
    for b in batches {
        let u = b
            .column_by_name("user")
            .unwrap()
            .as_primitive::<Int64Type>();
        let n = b.column_by_name("n").unwrap().as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            assert!(m.insert(u.value(i), n.value(i)).is_none(), "a user twice");
        }
    }
    m
}

fn expected_counts() -> BTreeMap<i64, i64> {
    let mut m = BTreeMap::new();
    for ((u, _), n) in expected_records() {
        *m.entry(u).or_insert(0) += n as i64;
    }
    m
}

fn config(protocol: ProtocolKind) -> CheckpointConfig {
    CheckpointConfig {
        protocol,
        interval: Some(Duration::from_millis(5)),
        min_pause: Duration::from_millis(5),
        full_every: 3,
        ..Default::default()
    }
}

fn options(failover: FailoverStrategy) -> JobOptions {
    JobOptions {
        channel_capacity: 4,
        failover,
        restart: RestartStrategy {
            attempts: 1,
            delay: Duration::ZERO,
        },
        ..Default::default()
    }
}

fn check(t: &FanOut, report: &JobReport) {
    assert!(!t.armed.load(Ordering::SeqCst), "the failure was injected");
    assert_eq!(report.restarts.len(), 1, "{:?}", report.restarts);
    let r = &report.restarts[0];
    let RestartScope::Upstream { tasks } = &r.scope else {
        panic!("not an upstream restart: {r:?}");
    };
    let names: Vec<String> = tasks.iter().map(|t| t.to_string()).collect();
    assert_eq!(names, ["src-0", "stage-0", "fail-0"], "{r:?}");
    assert_eq!(
        r.failed.as_ref().map(|t| t.to_string()).as_deref(),
        Some("fail-0")
    );
    assert_eq!(r.fallback, None);
    assert!(r.restored_from.is_some(), "restored from a checkpoint");
    // Exactly the restarted subtasks were made again; the healthy sinks
    // (and sink_a-0, downstream of the failed task) never restarted.
    let made = |v: &str| t.made[v].load(Ordering::SeqCst);
    assert_eq!(made("stage"), 3);
    assert_eq!(made("fail"), 3);
    for v in ["sink_a", "sink_b", "agg_c"] {
        assert_eq!(made(v), 2, "{v} restarted");
    }
    assert_eq!(made("sink_c"), 1);
    // Every sink's output equals a failure-free run.
    let want = expected_records();
    assert_eq!(records(&t.a.batches()), want, "sink_a");
    assert_eq!(records(&t.b.batches()), want, "sink_b");
    assert_eq!(user_counts(&t.c.batches()), expected_counts(), "sink_c");
    // The healthy tasks downstream of the replay dropped it.
    let dropped: u64 = report.tasks.iter().map(|t| t.replayed_dropped).sum();
    assert!(
        dropped > 0,
        "nothing replayed was dropped: {:?}",
        report.tasks
    );
    let healthy_dropped: u64 = report
        .tasks
        .iter()
        .filter(|t| !names.contains(&t.task.to_string()))
        .map(|t| t.replayed_dropped)
        .sum();
    assert_eq!(
        healthy_dropped, dropped,
        "only healthy receivers drop replays"
    );
}

fn run_in_memory(protocol: ProtocolKind) {
    let t = fan_out();
    let report = Job::new(
        t.graph.clone(),
        config(protocol),
        options(FailoverStrategy::Upstream),
    )
    .unwrap()
    .run(Arc::new(InMemorySnapshots::new()))
    .unwrap();
    check(&t, &report);
}

#[test]
fn aligned_a_failed_task_restarts_with_its_upstream_and_every_sink_is_exact() {
    run_in_memory(ProtocolKind::Aligned);
}

#[test]
fn unaligned_a_failed_task_restarts_with_its_upstream_and_every_sink_is_exact() {
    run_in_memory(ProtocolKind::Unaligned);
}

#[test]
fn chandy_lamport_a_failed_task_restarts_with_its_upstream_and_every_sink_is_exact() {
    run_in_memory(ProtocolKind::ChandyLamport);
}

#[test]
fn upstream_failover_from_a_durable_store_restores_channel_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let t = fan_out();
    let r = run_durable(
        t.graph.clone(),
        config(ProtocolKind::Aligned),
        options(FailoverStrategy::Upstream),
        &DurableOptions::new(dir.path()),
        &mut |_| {},
    )
    .unwrap();
    check(&t, &r.report);
    // The manifest records every task's channel numbers.
    let reader = snapcut_core::store::SnapshotReader::open(dir.path()).unwrap();
    let last = *reader.list().unwrap().last().unwrap();
    let manifest = reader.manifest(last).unwrap();
    let stage = manifest
        .tasks
        .iter()
        .find(|t| t.vertex == "stage" && t.subtask == 1)
        .unwrap();
    assert_eq!(stage.taken_seq.len(), 1);
    // fail (forward), sink_b (forward), agg_c (hash: both subtasks).
    assert_eq!(stage.sent_seq.len(), 4);
    // It forwards every record it takes to fail and to sink_b.
    let taken = stage.taken_seq[0];
    assert!(taken > 0, "{stage:?}");
    assert_eq!(&stage.sent_seq[..2], &[taken, taken], "{stage:?}");
    assert_eq!(stage.sent_seq[2] + stage.sent_seq[3], taken, "{stage:?}");
}

#[test]
fn a_failure_whose_upstream_is_the_whole_job_restarts_the_region_and_says_so() {
    // src -> stage -> fail (the only sink): its upstream is every task.
    let armed = Arc::new(AtomicBool::new(true));
    let mut g = LogicalGraph::new();
    let src = g.add_source("src", 1, dwell_source(COUNT, USERS, SEED, BATCH).unwrap());
    let stage = g.add_operator(
        "stage",
        1,
        keyed_aggregate_forwarding("user", vec![AggSpec::count("dwell_ms", "n")]).unwrap(),
    );
    g.connect(src, stage, Partitioning::Forward);
    let a = armed.clone();
    let fail = g.add_operator(
        "fail",
        1,
        Arc::new(
            move |_: usize, _: usize| -> snapcut_core::Result<Box<dyn Operator>> {
                Ok(Box::new(FailOnce {
                    armed: a.clone(),
                    fails: true,
                    committed: false,
                }))
            },
        ),
    );
    g.connect(stage, fail, Partitioning::Forward);
    let report = Job::new(
        g,
        config(ProtocolKind::Aligned),
        options(FailoverStrategy::Upstream),
    )
    .unwrap()
    .run(Arc::new(InMemorySnapshots::new()))
    .unwrap();
    assert!(!armed.load(Ordering::SeqCst));
    assert_eq!(report.restarts.len(), 1);
    let r = &report.restarts[0];
    let RestartScope::Region { tasks, .. } = &r.scope else {
        panic!("not a region restart: {r:?}");
    };
    assert_eq!(tasks.len(), 3);
    let why = r.fallback.as_deref().unwrap_or_default();
    assert!(
        why.contains("the upstream of fail-0 is the whole job"),
        "{r:?}"
    );
}
