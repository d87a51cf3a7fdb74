//! A sink that bounds diff chains itself (`SnapshotSink::materializes`)
//! gets only diffs from the tasks after their first capture: the store
//! merges their runs in the background (never at commit, never on the
//! tasks' threads), and every checkpoint still restores to the right state.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use snapcut_core::graph::{LogicalGraph, Partitioning};
use snapcut_core::protocol::{CheckpointId, ProtocolKind};
use snapcut_core::runtime::ops::{
    collect_sink, dwell_record, dwell_source, keyed_aggregate, AggSpec,
};
use snapcut_core::runtime::{run_durable, CheckpointConfig, DurableOptions, Job, JobOptions};
use snapcut_core::snapshot::{
    CheckpointMeta, CompletedCheckpoint, SnapshotSink, StateCapture, StateKind, TaskSnapshot,
};
use snapcut_core::store::{FileKind, FileRole, SnapshotReader, SnapshotStore, StoreOptions};

// Many more users than an interval touches: a capture of most keys, or a
// chain of diffs holding as many rows as the table, would be stored full by
// the task, and this tests the store's materialization.
const USERS: u64 = 100_000;
const COUNT: u64 = 200_000;

/// Slow source batches so that many checkpoints fall inside the run.
fn graph() -> LogicalGraph {
    let mut g = LogicalGraph::new();
    let src = g.add_source("src", 2, dwell_source(COUNT, USERS, 3, 50).unwrap());
    let slow = g.add_operator(
        "slow",
        2,
        snapcut_core::runtime::ops::map_batches(|b| {
            std::thread::sleep(Duration::from_micros(300));
            Ok(Some(b))
        }),
    );
    let agg = g.add_operator(
        "agg",
        2,
        keyed_aggregate("user", vec![AggSpec::count("dwell_ms", "n")]).unwrap(),
    );
    let (sink, _) = collect_sink();
    let sink = g.add_operator("sink", 1, sink);
    g.connect(src, slow, Partitioning::Forward);
    g.connect(slow, agg, Partitioning::Hash { key: "user".into() });
    g.connect(agg, sink, Partitioning::RoundRobin);
    g
}

/// The bound on each wait for the compactor: far above a merge of this
/// test's few thousand keys on a loaded machine (milliseconds to a second),
/// so running out of it is a hung compactor, not a slow one.
const WAIT: Duration = Duration::from_secs(60);

/// Records the kind of every state capture the `agg` tasks hand over.
/// Before each commit it waits (at most [`WAIT`]) for the compactions
/// handed over so far, so the commit adopts what they merged: whether a
/// merge is adopted within the run does not depend on the compactor's
/// speed under load. The store's commit itself never waits for them.
struct Recording {
    store: Arc<SnapshotStore>,
    kinds: Mutex<Vec<(CheckpointId, String, StateKind)>>,
    /// Each `agg` task's state at its captures (the oldest still a possible
    /// base onwards), rebuilt from the captures themselves.
    states: Mutex<BTreeMap<String, TaskStates>>,
    /// Fulls after a task's first whose table changed under half since
    /// the oldest base its capture could have had (`full_beats_diff` says
    /// a diff then), on a chain whose diffs with them would hold fewer rows
    /// than the table (the aggregate's `full_beats_chain` says a diff too).
    unjustified: Mutex<Vec<(CheckpointId, String, usize, usize)>>,
    /// Commits before which the compactions were not done within [`WAIT`].
    hung: Mutex<Vec<CheckpointId>>,
}

impl SnapshotSink for Recording {
    fn task_snapshot(&self, id: CheckpointId, s: TaskSnapshot) -> snapcut_core::Result<()> {
        if let (true, Some(state)) = (s.task.vertex == "agg", &s.state) {
            let task = s.task.to_string();
            self.kinds
                .lock()
                .unwrap()
                .push((id, task.clone(), state.kind));
            let mut states = self.states.lock().unwrap();
            let t = states.entry(task.clone()).or_default();
            if let Some((changed, len, chain)) = t.capture(id, state) {
                if changed * 2 < len && chain + changed < len {
                    let mut unjustified = self.unjustified.lock().unwrap();
                    unjustified.push((id, task, changed, len));
                }
            }
        }
        self.store.task_snapshot(id, s)
    }
    fn commit(&self, meta: CheckpointMeta) -> snapcut_core::Result<()> {
        if !self.store.wait_for_compactions(WAIT) {
            self.hung.lock().unwrap().push(meta.id);
        }
        self.store.commit(meta)
    }
    fn abort(&self, id: CheckpointId) -> snapcut_core::Result<()> {
        self.store.abort(id)
    }
    fn latest_completed(&self) -> snapcut_core::Result<Option<CompletedCheckpoint>> {
        self.store.latest_completed()
    }
    fn materializes(&self) -> bool {
        self.store.materializes()
    }
}

/// One task's states at its captures, and the oldest base its next
/// capture can have: confirmations only move forward, so that is the base
/// of its newest diff (or its first full).
#[derive(Default)]
struct TaskStates {
    at: BTreeMap<CheckpointId, BTreeMap<i64, i64>>,
    /// The rows of the diffs in each capture's chain.
    chain: BTreeMap<CheckpointId, usize>,
    floor: Option<CheckpointId>,
}

impl TaskStates {
    /// Takes capture `id` in; for a full after the first, returns how many
    /// keys changed since the oldest possible base (an upper bound of what
    /// its diff would have held), the table's length, and the most rows
    /// the chain of any possible base held (the base is one of the
    /// captures since that oldest one).
    fn capture(&mut self, id: CheckpointId, state: &StateCapture) -> Option<(usize, usize, usize)> {
        let b = &state.batch;
        let users = b
            .column_by_name("user")
            .unwrap()
            .as_primitive::<Int64Type>();
        let n = b.column_by_name("n").unwrap().as_primitive::<Int64Type>();
        let rows = (0..b.num_rows()).map(|i| (users.value(i), n.value(i)));
        let (now, judged) = match state.kind {
            StateKind::Full => {
                let now: BTreeMap<i64, i64> = rows.collect();
                let judged = self.floor.map(|floor| {
                    let then = &self.at[&floor];
                    let changed = now.iter().filter(|(k, v)| then.get(k) != Some(v)).count();
                    let chain = self.chain.range(floor..).map(|(_, &r)| r).max();
                    (changed, now.len(), chain.unwrap_or(0))
                });
                self.floor.get_or_insert(id);
                self.chain.insert(id, 0);
                (now, judged)
            }
            StateKind::Diff { base } => {
                let mut now = self.at[&base].clone();
                now.extend(rows);
                self.chain.insert(id, self.chain[&base] + b.num_rows());
                self.floor = Some(base);
                (now, None)
            }
        };
        self.at.insert(id, now);
        let floor = self.floor.expect("set above");
        self.at.retain(|&i, _| i >= floor);
        self.chain.retain(|&i, _| i >= floor);
        judged
    }
}

fn config() -> CheckpointConfig {
    CheckpointConfig {
        protocol: ProtocolKind::Aligned,
        interval: Some(Duration::from_millis(10)),
        full_every: 3,
        retained: 100,
        ..Default::default()
    }
}

/// Count per user of the first `offsets[s]` records of each source subtask.
fn expected_counts(reader: &SnapshotReader, id: CheckpointId) -> BTreeMap<i64, i64> {
    let mut m = BTreeMap::new();
    let offsets = reader.source_offsets(id).unwrap();
    for (task, offset) in offsets {
        // The dwell source deals record i to subtask i % parallelism.
        let par = 2;
        for k in 0..offset {
            let i = k * par + task.subtask as u64;
            *m.entry(dwell_record(3, i, USERS).0).or_insert(0) += 1;
        }
    }
    m
}

fn state_counts(reader: &SnapshotReader, id: CheckpointId) -> BTreeMap<i64, i64> {
    let mut m = BTreeMap::new();
    for subtask in 0..2 {
        let task = snapcut_core::snapshot::TaskId {
            vertex: "agg".into(),
            subtask,
        };
        let Some(b) = reader.state(id, &task).unwrap() else {
            continue;
        };
        let u = b
            .column_by_name("user")
            .unwrap()
            .as_primitive::<Int64Type>();
        let n = b.column_by_name("n").unwrap().as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            assert!(m.insert(u.value(i), n.value(i)).is_none());
        }
    }
    m
}

#[test]
fn tasks_send_only_diffs_and_the_store_compacts_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(
        dir.path(),
        StoreOptions {
            retain: 100,
            materialize_every: Some(3),
            ..Default::default()
        },
    )
    .unwrap();
    let sink = Arc::new(Recording {
        store,
        kinds: Mutex::new(Vec::new()),
        states: Mutex::new(BTreeMap::new()),
        unjustified: Mutex::new(Vec::new()),
        hung: Mutex::new(Vec::new()),
    });
    Job::new(graph(), config(), JobOptions::default())
        .unwrap()
        .run(sink.clone())
        .unwrap();
    let hung = sink.hung.lock().unwrap().clone();
    assert!(
        hung.is_empty(),
        "compactor still busy after {WAIT:?} before {hung:?}"
    );
    let kinds = sink.kinds.lock().unwrap().clone();
    let fulls: Vec<_> = kinds.iter().filter(|k| k.2 == StateKind::Full).collect();
    let diffs = kinds.len() - fulls.len();
    // Each task's first capture is full; any other full is one where at
    // least half its keys changed (the table still filling up), a diff
    // holding most of it otherwise: never one a diff would have beaten.
    let unjustified = sink.unjustified.lock().unwrap().clone();
    assert!(
        unjustified.is_empty(),
        "fulls where under half the keys changed (id, task, changed, keys): {unjustified:?}"
    );
    assert!(
        diffs > fulls.len(),
        "the tasks sent diffs: {diffs} diffs, fulls {fulls:?}"
    );
    let reader = SnapshotReader::open(dir.path()).unwrap();
    let ids = reader.list().unwrap();
    assert!(ids.len() >= 6, "enough checkpoints to compact: {ids:?}");
    let mut merged = 0;
    for &id in &ids {
        let manifest = reader.verify(id).unwrap();
        for f in manifest.files.iter().filter(|f| f.role == FileRole::State) {
            if f.vertex.as_deref() != Some("agg") {
                continue;
            }
            assert_eq!(f.runs.last().map(|r| r.kind), Some(FileKind::Full));
            merged += usize::from(f.runs.iter().any(|r| r.merges.len() > 1));
        }
        assert_eq!(
            state_counts(&reader, id),
            expected_counts(&reader, id),
            "checkpoint {id}"
        );
    }
    let stats = sink.store.compaction_stats();
    assert!(
        merged >= 1 && stats.adopted >= 1 && stats.failed == 0,
        "the store adopted merged runs: {merged} states, {stats:?}"
    );
}

#[test]
fn durable_runs_let_the_store_materialize() {
    let dir = tempfile::tempdir().unwrap();
    run_durable(
        graph(),
        config(),
        JobOptions::default(),
        &DurableOptions::new(dir.path()),
        &mut |_| {},
    )
    .unwrap();
    let reader = SnapshotReader::open(dir.path()).unwrap();
    let ids = reader.list().unwrap();
    let mut diffs = 0;
    for &id in &ids {
        let manifest = reader.verify(id).unwrap();
        for f in manifest.files.iter().filter(|f| f.role == FileRole::State) {
            diffs += usize::from(f.kind == Some(FileKind::Diff));
        }
        assert_eq!(
            state_counts(&reader, id),
            expected_counts(&reader, id),
            "checkpoint {id}"
        );
    }
    assert!(diffs > 0, "incremental checkpoints were written");
}
