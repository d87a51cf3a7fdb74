//! A sink that bounds diff chains itself (`SnapshotSink::materializes`)
//! gets only diffs from the tasks after their first capture: the full state
//! every `full_every` checkpoints is rebuilt by the store at commit, off the
//! tasks' threads, and every checkpoint still restores to the right state.

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
    CheckpointMeta, CompletedCheckpoint, SnapshotSink, StateKind, TaskSnapshot,
};
use snapcut_core::store::{FileKind, FileRole, SnapshotReader, SnapshotStore, StoreOptions};

// More users than an interval touches: a capture of every key would be
// stored full by the task, and this tests the store's materialization.
const USERS: u64 = 20_000;
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

/// Records the kind of every state capture the `agg` tasks hand over.
struct Recording {
    store: Arc<SnapshotStore>,
    kinds: Mutex<Vec<(CheckpointId, String, StateKind)>>,
}

impl SnapshotSink for Recording {
    fn task_snapshot(&self, id: CheckpointId, s: TaskSnapshot) -> snapcut_core::Result<()> {
        if let (true, Some(state)) = (s.task.vertex == "agg", &s.state) {
            let mut kinds = self.kinds.lock().unwrap();
            kinds.push((id, s.task.to_string(), state.kind));
        }
        self.store.task_snapshot(id, s)
    }
    fn commit(&self, meta: CheckpointMeta) -> snapcut_core::Result<()> {
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
fn tasks_send_only_diffs_and_the_store_materializes_every_full_every() {
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
    });
    Job::new(graph(), config(), JobOptions::default())
        .unwrap()
        .run(sink.clone())
        .unwrap();
    let kinds = sink.kinds.lock().unwrap().clone();
    let fulls: Vec<_> = kinds.iter().filter(|k| k.2 == StateKind::Full).collect();
    assert_eq!(
        fulls.len(),
        2,
        "one full capture per agg task, the first: {fulls:?}"
    );
    let reader = SnapshotReader::open(dir.path()).unwrap();
    let ids = reader.list().unwrap();
    assert!(ids.len() >= 6, "enough checkpoints to materialize: {ids:?}");
    let mut materialized = 0;
    for &id in &ids {
        let manifest = reader.verify(id).unwrap();
        for f in manifest.files.iter().filter(|f| f.role == FileRole::State) {
            if f.vertex.as_deref() != Some("agg") {
                continue;
            }
            assert!(f.chain.len() <= 3, "checkpoint {id}: chain {:?}", f.chain);
            if f.kind == Some(FileKind::Full) && f.chain.len() == 1 && id != ids[0] {
                materialized += 1;
            }
        }
        assert_eq!(
            state_counts(&reader, id),
            expected_counts(&reader, id),
            "checkpoint {id}"
        );
    }
    assert!(
        materialized >= 2,
        "the store wrote full states: {materialized}"
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
            assert!(f.chain.len() <= 3, "checkpoint {id}: chain {:?}", f.chain);
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
