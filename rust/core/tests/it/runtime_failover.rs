//! Regional failover: a failed task restarts only the tasks connected to it
//! (its region) from the newest completed checkpoint, while independent
//! pipelines of the same job keep running; `full` restarts every task.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::RecordBatch;
use snapcut_core::graph::{LogicalGraph, Partitioning};
use snapcut_core::operator::{Batch, Emitter, Operator, Source, SourceFactory};
use snapcut_core::protocol::{CheckpointId, InputId, ProtocolKind};
use snapcut_core::runtime::ops::{
    collect_sink, dwell_record, dwell_source, keyed_aggregate, AggSpec, Collected,
};
use snapcut_core::runtime::{
    run_durable, CheckpointConfig, DurableOptions, FailoverStrategy, InMemorySnapshots, Job,
    JobOptions, RestartScope, RestartStrategy,
};
use snapcut_core::snapshot::{CheckpointMeta, CompletedCheckpoint, SnapshotSink, TaskSnapshot};

const USERS: u64 = 30;
const COUNT: u64 = 40_000;
const BATCH: usize = 100;

/// Counts the sources a factory makes: each (re)start of a subtask makes one.
struct Counted {
    inner: Arc<dyn SourceFactory>,
    made: Arc<AtomicUsize>,
}

impl SourceFactory for Counted {
    fn create(&self, subtask: usize, parallelism: usize) -> snapcut_core::Result<Box<dyn Source>> {
        self.made.fetch_add(1, Ordering::SeqCst);
        self.inner.create(subtask, parallelism)
    }
}

/// When [`FailOnce`] fails.
#[derive(Clone, Copy)]
enum When {
    /// On the first batch after a checkpoint it took part in completed.
    AfterCommit,
    /// On its `n`-th batch, checkpoints or not.
    AtBatch(usize),
}

/// Passes batches through slowly; the first subtask allowed by `subtask`
/// to reach `when` fails once (the shared `armed` flag).
struct FailOnce {
    armed: Arc<AtomicBool>,
    when: When,
    fails: bool,
    committed: bool,
    seen: usize,
}

impl Operator for FailOnce {
    fn process(
        &mut self,
        _i: InputId,
        batch: Batch,
        out: &mut dyn Emitter,
    ) -> snapcut_core::Result<()> {
        // Slowly until a checkpoint has completed, so that on a loaded
        // machine one completes before the input runs out (else an
        // `AfterCommit` failure would never fire).
        let pause = if self.committed { 500 } else { 2_000 };
        std::thread::sleep(Duration::from_micros(pause));
        self.seen += 1;
        let due = match self.when {
            When::AfterCommit => self.committed,
            When::AtBatch(n) => self.seen >= n,
        };
        if self.fails && due && self.armed.swap(false, Ordering::SeqCst) {
            return Err(snapcut_core::Error::Task("injected failure".into()));
        }
        out.emit(batch)
    }
    fn commit(&mut self, _id: CheckpointId) -> snapcut_core::Result<()> {
        self.committed = true;
        Ok(())
    }
}

fn fail_once(
    armed: Arc<AtomicBool>,
    when: When,
    only_subtask: Option<usize>,
) -> Arc<dyn snapcut_core::operator::OperatorFactory> {
    Arc::new(
        move |subtask: usize, _: usize| -> snapcut_core::Result<Box<dyn Operator>> {
            Ok(Box::new(FailOnce {
                armed: armed.clone(),
                when,
                fails: only_subtask.is_none_or(|s| s == subtask),
                committed: false,
                seen: 0,
            }))
        },
    )
}

/// `<name>_src -> [fail ->] <name>_agg -> <name>_sink`, counting per user.
fn pipeline(
    g: &mut LogicalGraph,
    name: &str,
    seed: u64,
    par: usize,
    fail: Option<Arc<dyn snapcut_core::operator::OperatorFactory>>,
) -> (Collected, Arc<AtomicUsize>) {
    let made = Arc::new(AtomicUsize::new(0));
    let src = g.add_source(
        format!("{name}_src"),
        par,
        Arc::new(Counted {
            inner: dwell_source(COUNT, USERS, seed, BATCH).unwrap(),
            made: made.clone(),
        }),
    );
    let mut last = src;
    if let Some(f) = fail {
        let fail = g.add_operator(format!("{name}_fail"), par, f);
        g.connect(src, fail, Partitioning::Forward);
        last = fail;
    }
    let agg = g.add_operator(
        format!("{name}_agg"),
        par,
        keyed_aggregate("user", vec![AggSpec::count("dwell_ms", "n")]).unwrap(),
    );
    let (sink, out) = collect_sink();
    let sink = g.add_operator(format!("{name}_sink"), 1, sink);
    g.connect(last, agg, Partitioning::Hash { key: "user".into() });
    g.connect(agg, sink, Partitioning::RoundRobin);
    (out, made)
}

fn expected(seed: u64) -> BTreeMap<i64, i64> {
    let mut m = BTreeMap::new();
    for i in 0..COUNT {
        *m.entry(dwell_record(seed, i, USERS).0).or_insert(0) += 1;
    }
    m
}

fn counts(batches: &[RecordBatch]) -> BTreeMap<i64, i64> {
    let mut m = BTreeMap::new();
    for b in batches {
        let u = b
            .column_by_name("user")
            .unwrap()
            .as_primitive::<Int64Type>();
        let n = b.column_by_name("n").unwrap().as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            assert!(
                m.insert(u.value(i), n.value(i)).is_none(),
                "duplicate user row"
            );
        }
    }
    m
}

fn config() -> CheckpointConfig {
    CheckpointConfig {
        protocol: ProtocolKind::Aligned,
        interval: Some(Duration::from_millis(5)),
        // Time to make progress between checkpoints on a loaded machine
        // (sync checkpoints pause the sources while they run).
        min_pause: Duration::from_millis(5),
        full_every: 3,
        ..Default::default()
    }
}

fn options(failover: FailoverStrategy, attempts: u32) -> JobOptions {
    JobOptions {
        channel_capacity: 4,
        failover,
        restart: RestartStrategy {
            attempts,
            delay: Duration::ZERO,
        },
        ..Default::default()
    }
}

/// Two independent pipelines; `a` fails once after a checkpoint.
struct TwoPipelines {
    graph: LogicalGraph,
    a: Collected,
    a_made: Arc<AtomicUsize>,
    b: Collected,
    b_made: Arc<AtomicUsize>,
    armed: Arc<AtomicBool>,
}

fn two_pipelines() -> TwoPipelines {
    let armed = Arc::new(AtomicBool::new(true));
    let mut graph = LogicalGraph::new();
    let (a, a_made) = pipeline(
        &mut graph,
        "a",
        7,
        2,
        Some(fail_once(armed.clone(), When::AfterCommit, None)),
    );
    let (b, b_made) = pipeline(&mut graph, "b", 9, 2, None);
    TwoPipelines {
        graph,
        a,
        a_made,
        b,
        b_made,
        armed,
    }
}

/// Runs `graph` with in-memory checkpoints and `attempts` restarts.
fn run_in_memory(
    graph: LogicalGraph,
    failover: FailoverStrategy,
    attempts: u32,
) -> snapcut_core::Result<snapcut_core::runtime::JobReport> {
    Job::new(graph, config(), options(failover, attempts))?.run(Arc::new(InMemorySnapshots::new()))
}

/// Both pipelines' results equal a failure-free run.
fn assert_exact(a: &Collected, b: &Collected) {
    assert_eq!(counts(&a.batches()), expected(7));
    assert_eq!(counts(&b.batches()), expected(9));
}

fn task_names(scope: &RestartScope) -> Vec<String> {
    match scope {
        RestartScope::Region { tasks, .. } | RestartScope::Upstream { tasks } => {
            tasks.iter().map(|t| t.to_string()).collect()
        }
        RestartScope::Job => vec!["<job>".into()],
    }
}

#[test]
fn a_failure_restarts_only_its_pipeline_and_both_results_are_exact() {
    let t = two_pipelines();
    let snapshots = Arc::new(InMemorySnapshots::new());
    let report = Job::new(t.graph, config(), options(FailoverStrategy::Region, 1))
        .unwrap()
        .run(snapshots)
        .unwrap();
    assert!(!t.armed.load(Ordering::SeqCst), "the failure was injected");
    assert_eq!(report.restarts.len(), 1, "{:?}", report.restarts);
    let r = &report.restarts[0];
    assert!(
        r.error.contains("a_fail-") && r.error.contains("injected failure"),
        "{}",
        r.error
    );
    assert!(r.restored_from.is_some(), "restored from a checkpoint");
    assert_eq!(
        task_names(&r.scope),
        ["a_src-0", "a_src-1", "a_fail-0", "a_fail-1", "a_agg-0", "a_agg-1", "a_sink-0"]
    );
    // Pipeline a's sources were made twice, b's once: b never stopped.
    assert_eq!(t.a_made.load(Ordering::SeqCst), 4);
    assert_eq!(t.b_made.load(Ordering::SeqCst), 2);
    assert_exact(&t.a, &t.b);
    let completed = report.completed_checkpoints().count();
    assert!(
        completed >= 2,
        "checkpoints before and after the failover: {completed}"
    );
}

#[test]
fn regional_failover_from_a_durable_store_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let t = two_pipelines();
    let r = run_durable(
        t.graph,
        config(),
        options(FailoverStrategy::Region, 2),
        &DurableOptions::new(dir.path()),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(r.restarts.len(), 1, "{:?}", r.restarts);
    assert!(matches!(r.restarts[0].scope, RestartScope::Region { .. }));
    assert_eq!(
        r.report.restarts, r.restarts,
        "this attempt did the restart"
    );
    assert_eq!(t.b_made.load(Ordering::SeqCst), 2, "b never restarted");
    assert_exact(&t.a, &t.b);
}

#[test]
fn full_failover_restarts_every_task() {
    let t = two_pipelines();
    let report = run_in_memory(t.graph, FailoverStrategy::Full, 1).unwrap();
    assert_eq!(report.restarts.len(), 1);
    assert_eq!(task_names(&report.restarts[0].scope).len(), 12);
    assert_eq!(t.a_made.load(Ordering::SeqCst), 4);
    assert_eq!(t.b_made.load(Ordering::SeqCst), 4, "b restarted too");
    assert_exact(&t.a, &t.b);
}

#[test]
fn without_restarts_left_the_job_fails_with_the_task_error() {
    let t = two_pipelines();
    let err = run_in_memory(t.graph, FailoverStrategy::Region, 0).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("a_fail-") && msg.contains("injected failure"),
        "{msg}"
    );
    assert_eq!(msg.matches("task failed").count(), 1, "{msg}");
}

#[test]
fn a_forward_pipeline_restarts_only_the_failed_subtask_chain() {
    let armed = Arc::new(AtomicBool::new(true));
    let made = Arc::new(AtomicUsize::new(0));
    let mut g = LogicalGraph::new();
    let src = g.add_source(
        "src",
        2,
        Arc::new(Counted {
            inner: dwell_source(COUNT, USERS, 7, BATCH).unwrap(),
            made: made.clone(),
        }),
    );
    let fail = g.add_operator(
        "fail",
        2,
        fail_once(armed.clone(), When::AfterCommit, Some(1)),
    );
    let (sink, out) = collect_sink();
    let sink = g.add_operator("sink", 2, sink);
    g.connect(src, fail, Partitioning::Forward);
    g.connect(fail, sink, Partitioning::Forward);
    let report = run_in_memory(g, FailoverStrategy::Region, 1).unwrap();
    assert!(!armed.load(Ordering::SeqCst));
    assert_eq!(report.restarts.len(), 1);
    assert_eq!(
        task_names(&report.restarts[0].scope),
        ["src-1", "fail-1", "sink-1"]
    );
    assert_eq!(made.load(Ordering::SeqCst), 3, "only src-1 was made again");
    let mut seen = BTreeMap::new();
    for b in out.batches() {
        let u = b
            .column_by_name("user")
            .unwrap()
            .as_primitive::<Int64Type>();
        for v in u.values() {
            *seen.entry(*v).or_insert(0) += 1;
        }
    }
    assert_eq!(seen, expected(7), "every record exactly once");
}

/// An in-memory sink whose commits all fail: checkpoints are taken (tasks
/// snapshot, sinks pre-commit) but none ever completes.
struct NeverCommits {
    inner: InMemorySnapshots,
    attempts: AtomicUsize,
}

impl SnapshotSink for NeverCommits {
    fn task_snapshot(&self, id: CheckpointId, s: TaskSnapshot) -> snapcut_core::Result<()> {
        self.inner.task_snapshot(id, s)
    }
    fn commit(&self, _meta: CheckpointMeta) -> snapcut_core::Result<()> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        Err(snapcut_core::Error::Snapshot("commits are refused".into()))
    }
    fn abort(&self, id: CheckpointId) -> snapcut_core::Result<()> {
        self.inner.abort(id)
    }
    fn latest_completed(&self) -> snapcut_core::Result<Option<CompletedCheckpoint>> {
        self.inner.latest_completed()
    }
}

#[test]
fn a_region_with_no_completed_checkpoint_restarts_from_the_beginning_exactly_once() {
    let armed = Arc::new(AtomicBool::new(true));
    let mut g = LogicalGraph::new();
    let src = g.add_source("src", 2, dwell_source(COUNT, USERS, 7, BATCH).unwrap());
    let fail = g.add_operator(
        "fail",
        2,
        fail_once(armed.clone(), When::AtBatch(120), Some(0)),
    );
    let (sink, out) = collect_sink();
    let sink_v = g.add_operator("sink", 1, sink);
    g.connect(src, fail, Partitioning::Forward);
    g.connect(fail, sink_v, Partitioning::RoundRobin);
    let sink = Arc::new(NeverCommits {
        inner: InMemorySnapshots::new(),
        attempts: AtomicUsize::new(0),
    });
    let cfg = CheckpointConfig {
        tolerable_failures: u32::MAX,
        ..config()
    };
    let report = Job::new(g, cfg, options(FailoverStrategy::Region, 1))
        .unwrap()
        .run(sink.clone())
        .unwrap();
    assert!(!armed.load(Ordering::SeqCst));
    assert!(
        sink.attempts.load(Ordering::SeqCst) > 0,
        "checkpoints were attempted"
    );
    assert_eq!(report.restarts.len(), 1);
    assert_eq!(report.restarts[0].restored_from, None);
    // What the sink pre-committed for checkpoints that never completed was
    // produced again after the restart: it must not show twice.
    assert_eq!(records_per_user(&out), expected(7));
}

#[test]
fn two_failures_use_two_restarts_and_a_third_fails_the_job() {
    for (attempts, ok) in [(2, true), (1, false)] {
        let armed_a = Arc::new(AtomicBool::new(true));
        let armed_b = Arc::new(AtomicBool::new(true));
        let mut g = LogicalGraph::new();
        let (a, _) = pipeline(
            &mut g,
            "a",
            7,
            1,
            Some(fail_once(armed_a.clone(), When::AfterCommit, None)),
        );
        let (b, _) = pipeline(
            &mut g,
            "b",
            9,
            1,
            Some(fail_once(armed_b.clone(), When::AtBatch(150), None)),
        );
        let outcome = run_in_memory(g, FailoverStrategy::Region, attempts);
        assert!(!armed_a.load(Ordering::SeqCst) && !armed_b.load(Ordering::SeqCst));
        if ok {
            let report = outcome.unwrap();
            let mut failed: Vec<String> = report
                .restarts
                .iter()
                .map(|r| task_names(&r.scope)[0].clone())
                .collect();
            failed.sort();
            assert_eq!(failed, ["a_src-0", "b_src-0"]);
            assert_eq!(counts(&a.batches()), expected(7));
            assert_eq!(counts(&b.batches()), expected(9));
        } else {
            let msg = outcome.unwrap_err().to_string();
            assert!(msg.contains("injected failure"), "{msg}");
        }
    }
}

/// Records per user in what a sink of raw dwell records published.
fn records_per_user(out: &Collected) -> BTreeMap<i64, i64> {
    let mut seen = BTreeMap::new();
    for b in out.batches() {
        let u = b
            .column_by_name("user")
            .unwrap()
            .as_primitive::<Int64Type>();
        for v in u.values() {
            *seen.entry(*v).or_insert(0) += 1;
        }
    }
    seen
}

/// SplitMix64: reproducible choices from a seed.
fn mix(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[test]
fn random_failures_in_random_pipelines_under_every_protocol_are_exact() {
    let protocols = [
        ProtocolKind::Aligned,
        ProtocolKind::Unaligned,
        ProtocolKind::ChandyLamport,
        ProtocolKind::Sync,
    ];
    for case in 0..16u64 {
        let mut rng = case;
        let protocol = protocols[(mix(&mut rng) % 4) as usize];
        let pipelines = 2 + (mix(&mut rng) % 2) as usize;
        let par = 1 + (mix(&mut rng) % 2) as usize;
        let mut g = LogicalGraph::new();
        let mut outs = Vec::new();
        let mut failing = Vec::new();
        for p in 0..pipelines {
            let fails = p == 0 || mix(&mut rng) % 2 == 0;
            let armed = Arc::new(AtomicBool::new(fails));
            let when = if mix(&mut rng) % 2 == 0 {
                When::AfterCommit
            } else {
                When::AtBatch(20 + (mix(&mut rng) % 150) as usize)
            };
            let seed = 100 + p as u64;
            let (out, made) = pipeline(
                &mut g,
                &format!("p{p}"),
                seed,
                par,
                Some(fail_once(armed.clone(), when, None)),
            );
            outs.push((seed, out, made));
            failing.push((fails, armed));
        }
        let cfg = CheckpointConfig {
            protocol,
            ..config()
        };
        let what = format!("case {case}: {protocol:?}, {pipelines} pipelines x{par}");
        let report = Job::new(g, cfg, options(FailoverStrategy::Region, pipelines as u32))
            .unwrap()
            .run(Arc::new(InMemorySnapshots::new()))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut restarted: Vec<String> = report
            .restarts
            .iter()
            .map(|r| task_names(&r.scope)[0].clone())
            .collect();
        restarted.sort();
        let want: Vec<String> = failing
            .iter()
            .enumerate()
            .filter(|(_, (fails, _))| *fails)
            .map(|(p, _)| format!("p{p}_src-0"))
            .collect();
        assert_eq!(
            restarted, want,
            "{what}: the failed pipelines, and only those"
        );
        for (p, (seed, out, made)) in outs.iter().enumerate() {
            assert!(!failing[p].1.load(Ordering::SeqCst), "{what}: p{p} armed");
            let starts = if failing[p].0 { 2 } else { 1 };
            assert_eq!(
                made.load(Ordering::SeqCst),
                starts * par,
                "{what}: p{p} sources"
            );
            assert_eq!(counts(&out.batches()), expected(*seed), "{what}: p{p}");
        }
    }
}

/// An in-memory sink whose newest checkpoint cannot be read back.
struct UnreadableLatest(InMemorySnapshots);

impl SnapshotSink for UnreadableLatest {
    fn task_snapshot(&self, id: CheckpointId, s: TaskSnapshot) -> snapcut_core::Result<()> {
        self.0.task_snapshot(id, s)
    }
    fn commit(&self, meta: CheckpointMeta) -> snapcut_core::Result<()> {
        self.0.commit(meta)
    }
    fn abort(&self, id: CheckpointId) -> snapcut_core::Result<()> {
        self.0.abort(id)
    }
    fn latest_completed(&self) -> snapcut_core::Result<Option<CompletedCheckpoint>> {
        Err(snapcut_core::Error::Snapshot(
            "checksum mismatch in agg-0".into(),
        ))
    }
}

#[test]
fn a_restart_that_cannot_read_the_last_checkpoint_fails_the_job_saying_why() {
    let t = two_pipelines();
    let err = Job::new(t.graph, config(), options(FailoverStrategy::Region, 1))
        .unwrap()
        .run(Arc::new(UnreadableLatest(InMemorySnapshots::new())))
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, snapcut_core::Error::Snapshot(_)), "{msg}");
    assert!(
        msg.contains("cannot restart after")
            && msg.contains("injected failure")
            && msg.contains("checksum mismatch in agg-0"),
        "{msg}"
    );
}

#[test]
fn a_region_whose_tasks_cannot_be_rebuilt_fails_the_job_saying_why() {
    let armed = Arc::new(AtomicBool::new(true));
    let made = Arc::new(AtomicUsize::new(0));
    let mut g = LogicalGraph::new();
    let src = g.add_source("src", 1, dwell_source(COUNT, USERS, 7, BATCH).unwrap());
    let inner = fail_once(armed, When::AtBatch(50), None);
    let counter = made.clone();
    let fail = g.add_operator(
        "fail",
        1,
        Arc::new(
            move |s: usize, p: usize| -> snapcut_core::Result<Box<dyn Operator>> {
                if counter.fetch_add(1, Ordering::SeqCst) > 0 {
                    return Err(snapcut_core::Error::Config(
                        "license server unreachable".into(),
                    ));
                }
                inner.create(s, p)
            },
        ),
    );
    let (sink, _) = collect_sink();
    let sink = g.add_operator("sink", 1, sink);
    g.connect(src, fail, Partitioning::Forward);
    g.connect(fail, sink, Partitioning::Forward);
    let msg = run_in_memory(g, FailoverStrategy::Region, 1)
        .unwrap_err()
        .to_string();
    assert_eq!(made.load(Ordering::SeqCst), 2, "the relaunch tried once");
    assert!(
        msg.contains("restarting after")
            && msg.contains("injected failure")
            && msg.contains("license server unreachable"),
        "{msg}"
    );
}
