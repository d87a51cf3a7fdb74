//! Shared helpers of the store tests (included with `mod` by each test file).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use snapcut_core::protocol::ProtocolKind;
use snapcut_core::snapshot::{
    ChannelLog, CheckpointMeta, SnapshotSink, StateCapture, StateRuns, TaskId, TaskSnapshot,
};
use snapcut_core::state::{StatePolicy, StateTable};
use snapcut_core::store::SnapshotStore;

pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
    ]))
}

pub fn rows(keys: impl IntoIterator<Item = i64>, add: i64) -> RecordBatch {
    let keys: Vec<i64> = keys.into_iter().collect();
    let vals: Vec<i64> = keys.iter().map(|k| k + add).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(Int64Array::from(vals)),
        ],
    )
    .unwrap()
}

/// Key to value of a batch with Int64 columns `k` and `v` (`schema()`).
pub fn as_map(b: &RecordBatch) -> BTreeMap<i64, i64> {
    let k = b.column_by_name("k").unwrap().as_primitive::<Int64Type>();
    let v = b.column_by_name("v").unwrap().as_primitive::<Int64Type>();
    (0..b.num_rows())
        .map(|i| (k.value(i), v.value(i)))
        .collect()
}

/// Upserts `keys` (value `k + add`) into the table and into its model.
pub fn upsert_both(t: &mut StateTable, model: &mut BTreeMap<i64, i64>, keys: &[i64], add: i64) {
    t.upsert(&rows(keys.iter().copied(), add)).unwrap();
    for &k in keys {
        model.insert(k, k.wrapping_add(add));
    }
}

/// Deletes `keys` from the table and from its model.
pub fn delete_both(t: &mut StateTable, model: &mut BTreeMap<i64, i64>, keys: &[i64]) {
    t.delete(&Int64Array::from(keys.to_vec())).unwrap();
    for k in keys {
        model.remove(k);
    }
}

pub fn table(full_every: u32) -> StateTable {
    StateTable::new(schema(), "k", StatePolicy { full_every }).unwrap()
}

pub fn task(v: &str, s: usize) -> TaskId {
    TaskId {
        vertex: v.into(),
        subtask: s,
    }
}

pub fn meta(id: u64, savepoint: bool) -> CheckpointMeta {
    CheckpointMeta {
        id,
        protocol: ProtocolKind::Aligned,
        started_ms: 1000 + id,
        finished_ms: 2000 + id,
        graph_fingerprint: "g1".into(),
        savepoint,
    }
}

/// Checkpoints `t` as task agg-0 plus a source with offset `id * 10` and a
/// one-batch channel log, and commits.
pub fn checkpoint(store: &SnapshotStore, t: &mut StateTable, id: u64, savepoint: bool) {
    let state = t.checkpoint(id).unwrap();
    store
        .task_snapshot(
            id,
            TaskSnapshot {
                task: task("agg", 0),
                state: Some(state),
                state_runs: None,
                channels: vec![ChannelLog {
                    input: 1,
                    edge: "agg<-loop".into(),
                    from_subtask: 0,
                    records: vec![rows([id as i64], 0)],
                }],
                source_offset: None,
                alignment_nanos: 5,
                sent_seq: Vec::new(),
                taken_seq: Vec::new(),
            },
        )
        .unwrap();
    store
        .task_snapshot(
            id,
            TaskSnapshot {
                task: task("src", 0),
                state: None,
                state_runs: None,
                channels: vec![],
                source_offset: Some(id * 10),
                alignment_nanos: 0,
                sent_seq: Vec::new(),
                taken_seq: Vec::new(),
            },
        )
        .unwrap();
    store.commit(meta(id, savepoint)).unwrap();
}

/// Commits checkpoint `id` with task agg-0's state alone: a capture, or the
/// runs a budgeted table leaves (`state_runs`).
pub fn commit_state(
    store: &SnapshotStore,
    id: u64,
    state: Option<StateCapture>,
    state_runs: Option<StateRuns>,
) {
    store
        .task_snapshot(
            id,
            TaskSnapshot {
                task: task("agg", 0),
                state,
                state_runs,
                channels: Vec::new(),
                source_offset: None,
                alignment_nanos: 0,
                sent_seq: Vec::new(),
                taken_seq: Vec::new(),
            },
        )
        .unwrap();
    store.commit(meta(id, false)).unwrap();
}

/// Puts `bytes` in place of the file at `path` by a rename, as the store
/// publishes a file (a test corrupting one): a reader or the store's
/// compactor thread may hold the old file mapped (`store/mapped.rs` maps
/// only files never written again), and rewriting it in place would shrink
/// it under that mapping: a SIGBUS (fcc90, 2026-12-06).
pub fn replace_file(path: &Path, bytes: impl AsRef<[u8]>) {
    let tmp = path.with_extension("replaced.tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}
