//! Tiered compaction in the background (issue 37): the store merges a
//! task's runs off the commit path, a later commit adopts the output, and
//! every checkpoint still restores what it captured; format 1 roots read
//! as before; retention keeps every run a checkpoint or a compaction needs.

use crate::store_common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::time::Duration;

use arrow_array::Int64Array;
use proptest::prelude::*;
use snapcut_core::snapshot::TaskId;
use snapcut_core::state::StateTable;
use snapcut_core::store::{
    checkpoint_dir_name, filter_file_name, CompactionBudget, FileKind, Manifest, SnapshotReader,
    SnapshotStore, StoreOptions, COMPACTING_DIR, FORMAT_VERSION,
};
use store_common::*;

/// The bound on every wait for the compactor in these tests: far above a
/// merge of their few hundred keys on a loaded machine (milliseconds), so
/// running out of it is a hung compactor, not a slow one.
const WAIT: Duration = Duration::from_secs(60);

fn agg() -> TaskId {
    task("agg", 0)
}

fn options(retain: usize, every: usize) -> StoreOptions {
    StoreOptions {
        retain,
        materialize_every: Some(every),
        ..Default::default()
    }
}

fn state_of(reader: &SnapshotReader, id: u64) -> BTreeMap<i64, i64> {
    as_map(&reader.state(id, &agg()).unwrap().unwrap())
}

/// A table restored from checkpoint `id`, as a restarted task holds it.
fn restored(reader: &SnapshotReader, id: u64) -> StateTable {
    let mut t = table(u32::MAX);
    t.restore(&reader.state_chain(id, &agg()).unwrap()).unwrap();
    t
}

fn state_entry(m: &Manifest) -> &snapcut_core::store::FileEntry {
    m.state_file(&agg()).unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Upsert(Vec<i64>, i64),
    Delete(Vec<i64>),
    Commit,
    /// Wait for the compactions handed over (the next commit adopts them).
    Compact,
    /// Continue from a table restored from the newest checkpoint.
    Restore,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (proptest::collection::vec(0i64..40, 1..8), any::<i32>())
            .prop_map(|(k, v)| Op::Upsert(k, v.into())),
        2 => proptest::collection::vec(0i64..40, 1..5).prop_map(Op::Delete),
        4 => Just(Op::Commit),
        2 => Just(Op::Compact),
        1 => Just(Op::Restore),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn every_retained_checkpoint_restores_the_model_through_compactions(
        ops in proptest::collection::vec(op(), 1..60),
        retain in 1usize..4,
        every in 1usize..4,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::open(dir.path(), options(retain, every)).unwrap();
        // Diffs only after the first capture: the store bounds the runs.
        let mut t = table(u32::MAX);
        let mut model: BTreeMap<i64, i64> = BTreeMap::new();
        let mut at: BTreeMap<u64, BTreeMap<i64, i64>> = BTreeMap::new();
        let mut id = 0u64;
        for op in ops {
            match op {
                Op::Upsert(keys, add) => upsert_both(&mut t, &mut model, &keys, add),
                Op::Delete(keys) => delete_both(&mut t, &mut model, &keys),
                Op::Commit => {
                    id += 1;
                    checkpoint(&store, &mut t, id, false);
                    at.insert(id, model.clone());
                }
                Op::Compact => prop_assert!(store.wait_for_compactions(WAIT)),
                Op::Restore => {
                    if let Some(&last) = at.keys().next_back() {
                        t = restored(store.reader(), last);
                        model = at[&last].clone();
                    }
                }
            }
        }
        let listed = store.reader().list().unwrap();
        for id in at.keys().rev().take(retain) {
            prop_assert!(listed.contains(id), "retained checkpoint {} missing", id);
        }
        for &id in &listed {
            store.reader().verify(id).unwrap();
            prop_assert_eq!(&state_of(store.reader(), id), &at[&id], "checkpoint {}", id);
            let m = store.reader().manifest(id).unwrap();
            let runs = &state_entry(&m).runs;
            prop_assert_eq!(runs.last().map(|r| r.kind), Some(FileKind::Full));
        }
        let stats = store.compaction_stats();
        prop_assert!(stats.failed == 0, "{:?}", stats);
        drop(store);
        // Outputs never adopted are cleared when the root is opened again.
        let again = SnapshotStore::open(dir.path(), options(retain, every)).unwrap();
        prop_assert_eq!(again.reader().list().unwrap(), listed);
        prop_assert_eq!(std::fs::read_dir(dir.path().join(COMPACTING_DIR)).unwrap().count(), 0);
    }
}

/// Base keys of checkpoint 1: a tier merge of a few small diffs stays
/// under a quarter of them.
const BASE_KEYS: std::ops::Range<i64> = 10_000..11_000;

/// Writes checkpoints `ids` into `store`: checkpoint 1 creates
/// [`BASE_KEYS`] too, each writes `width` keys overlapping the previous
/// checkpoint's and deletes one; returns the model at each.
fn write_wide(
    store: &SnapshotStore,
    t: &mut StateTable,
    ids: std::ops::RangeInclusive<u64>,
    model: &mut BTreeMap<i64, i64>,
    width: i64,
) -> BTreeMap<u64, BTreeMap<i64, i64>> {
    let mut at = BTreeMap::new();
    for id in ids {
        if id == 1 {
            t.upsert(&rows(BASE_KEYS, 0)).unwrap();
            model.extend(BASE_KEYS.map(|k| (k, k)));
        }
        let base = id as i64 * (width - 2);
        t.upsert(&rows(base..base + width, 100 * id as i64))
            .unwrap();
        for k in base..base + width {
            model.insert(k, k + 100 * id as i64);
        }
        t.delete(&Int64Array::from(vec![base - 2])).unwrap();
        model.remove(&(base - 2));
        checkpoint(store, t, id, false);
        at.insert(id, model.clone());
    }
    at
}

/// [`write_wide`] with 5 keys a checkpoint.
fn write(
    store: &SnapshotStore,
    t: &mut StateTable,
    ids: std::ops::RangeInclusive<u64>,
    model: &mut BTreeMap<i64, i64>,
) -> BTreeMap<u64, BTreeMap<i64, i64>> {
    write_wide(store, t, ids, model, 5)
}

#[test]
fn compaction_output_is_adopted_by_the_next_commit_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), options(10, 2)).unwrap();
    let mut t = table(u32::MAX);
    let mut model = BTreeMap::new();
    let mut at = write(&store, &mut t, 1..=3, &mut model);
    assert!(store.wait_for_compactions(WAIT));
    assert_eq!(store.compaction_stats().merged, 1);
    at.extend(write(&store, &mut t, 4..=4, &mut model));
    let stats = store.compaction_stats();
    assert_eq!((stats.adopted, stats.discarded), (1, 0), "{stats:?}");
    let m = store.reader().manifest(4).unwrap();
    let runs = &state_entry(&m).runs;
    // The diffs of 2 and 3 merged into one run in checkpoint 4's directory.
    let merged: Vec<_> = runs
        .iter()
        .map(|r| (r.checkpoint, r.merges.clone()))
        .collect();
    assert_eq!(merged, vec![(4, vec![4]), (4, vec![2, 3]), (1, vec![1])]);
    assert_eq!(state_entry(&m).chain, vec![1, 4]);
    assert_eq!(runs[1].kind, FileKind::Diff);
    assert!(runs[1].key_range.is_some() && runs[0].key_range.is_some());
    assert_eq!(m.format_version, FORMAT_VERSION);
    // Diff runs, merged or as written, carry a stored filter beside their
    // file; the base none.
    let dir4 = dir.path().join(checkpoint_dir_name(4));
    for run in &runs[..2] {
        let filter = run.filter.as_ref().expect("a diff run's filter");
        assert_eq!(filter.path, filter_file_name(&run.path));
        assert_eq!(
            fs::metadata(dir4.join(&filter.path)).unwrap().len(),
            filter.bytes
        );
    }
    assert!(runs[2].filter.is_none());
    for id in 1..=4 {
        store.reader().verify(id).unwrap();
        assert_eq!(state_of(store.reader(), id), at[&id], "checkpoint {id}");
    }
    // A corrupt run is named by verify and refused on restore.
    let path = dir.path().join("chk-00000004").join(&runs[1].path);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xFF;
    replace_file(&path, bytes);
    let err = store.reader().verify(4).unwrap_err().to_string();
    assert!(
        err.contains(&runs[1].path) && err.contains("checksum"),
        "{err}"
    );
    assert!(store.reader().state(4, &agg()).is_err());
    assert_eq!(state_of(store.reader(), 3), at[&3]);
}

#[test]
fn a_budgeted_compactor_rests_for_its_share_and_counts_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let budget = CompactionBudget {
        cpu_share: 0.25,
        bytes_per_s: None,
    };
    let budgeted = StoreOptions {
        compaction: budget,
        ..options(10, 2)
    };
    let store = SnapshotStore::open(dir.path(), budgeted).unwrap();
    let mut t = table(u32::MAX);
    let mut model = BTreeMap::new();
    let mut at = BTreeMap::new();
    for id in 1..=8u64 {
        at.extend(write(&store, &mut t, id..=id, &mut model));
        assert!(store.wait_for_compactions(WAIT));
    }
    let stats = store.compaction_stats();
    assert!(stats.adopted >= 2 && stats.failed == 0, "{stats:?}");
    assert!(stats.bytes_read > 0 && stats.bytes_written > 0, "{stats:?}");
    // Every job rests three times what it worked (a quarter of the time),
    // each rounded to the nanosecond.
    let (busy, rested) = (stats.busy.as_nanos(), stats.rested.as_nanos());
    assert!(busy > 0, "{stats:?}");
    assert!(
        rested.abs_diff(3 * busy) <= 4 * u128::from(stats.submitted),
        "{stats:?}"
    );
    for id in 1..=8 {
        assert_eq!(state_of(store.reader(), id), at[&id], "checkpoint {id}");
    }
    // A budget out of range is refused when the store opens, naming it.
    for (cpu_share, bytes_per_s, named) in [
        (0.0, None, "compaction_cpu_share"),
        (2.0, None, "compaction_cpu_share"),
        (1.0, Some(0), "compaction_bytes_per_s"),
    ] {
        let bad = StoreOptions {
            compaction: CompactionBudget {
                cpu_share,
                bytes_per_s,
            },
            ..options(1, 2)
        };
        let err = SnapshotStore::open(dir.path().join("bad"), bad).unwrap_err();
        assert!(err.to_string().contains(named), "{err}");
    }
}

#[test]
fn diffs_grow_into_a_base_merge_and_then_tier_merges() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), options(2, 2)).unwrap();
    let mut t = table(u32::MAX);
    let mut model = BTreeMap::new();
    let mut at = BTreeMap::new();
    let mut bases = 0;
    for id in 1..=12u64 {
        at.extend(write_wide(&store, &mut t, id..=id, &mut model, 100));
        assert!(store.wait_for_compactions(WAIT));
        let m = store.reader().manifest(id).unwrap();
        let runs = &state_entry(&m).runs;
        assert!(runs.len() <= 4, "checkpoint {id}: {} runs", runs.len());
        bases += usize::from(runs.last().unwrap().merges.len() > 1);
        assert_eq!(state_of(store.reader(), id), at[&id], "checkpoint {id}");
    }
    assert!(bases > 0, "a base merge was adopted");
    let stats = store.compaction_stats();
    assert!(stats.adopted >= 4 && stats.failed == 0, "{stats:?}");
    // Retention (2) removed the merged checkpoints' directories.
    assert!(store.reader().list().unwrap().len() <= 4);
}

#[test]
fn a_format_1_root_still_restores_and_compacts_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = BTreeMap::new();
    let mut t = table(u32::MAX);
    let mut at;
    {
        // No compaction: the runs are the chain, so stripping them and the
        // version gives exactly the manifests snapcut 1 wrote.
        let plain = StoreOptions {
            retain: 10,
            ..Default::default()
        };
        let store = SnapshotStore::open(dir.path(), plain).unwrap();
        at = write(&store, &mut t, 1..=4, &mut model);
    }
    for id in 1..=4u64 {
        let path = dir
            .path()
            .join(format!("chk-{id:08}"))
            .join("manifest.json");
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        json["format_version"] = 1.into();
        for f in json["files"].as_array_mut().unwrap() {
            f.as_object_mut().unwrap().remove("runs");
        }
        std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    }
    let reader = SnapshotReader::open(dir.path()).unwrap();
    for id in 1..=4 {
        let m = reader.verify(id).unwrap();
        assert_eq!((m.format_version, state_entry(&m).runs.len()), (1, 0));
        assert_eq!(state_of(&reader, id), at[&id], "format 1 checkpoint {id}");
    }
    // A store continues on the format 1 chain, compacting its files.
    let store = SnapshotStore::open(dir.path(), options(10, 2)).unwrap();
    let mut t = restored(store.reader(), 4);
    at.extend(write(&store, &mut t, 5..=5, &mut model));
    let runs = state_entry(&store.reader().manifest(5).unwrap())
        .runs
        .clone();
    assert_eq!(
        runs.iter().map(|r| r.checkpoint).collect::<Vec<_>>(),
        vec![5, 4, 3, 2, 1]
    );
    assert!(store.wait_for_compactions(WAIT));
    at.extend(write(&store, &mut t, 6..=6, &mut model));
    assert_eq!(store.compaction_stats().adopted, 1);
    for id in 1..=6 {
        store.reader().verify(id).unwrap();
        assert_eq!(state_of(store.reader(), id), at[&id], "checkpoint {id}");
    }
}

#[test]
fn commits_go_on_while_a_compaction_is_held_and_adopt_it_once_done() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), options(10, 1)).unwrap();
    // Held: a compaction as slow as can be, whatever the machine's load.
    let hold = store.hold_compactions().unwrap();
    let mut t = table(u32::MAX);
    let mut model = BTreeMap::new();
    let mut at = write(&store, &mut t, 1..=6, &mut model);
    let stats = store.compaction_stats();
    // One job per task: handed over once, the later commits hand none.
    assert_eq!(
        (stats.submitted, stats.merged, stats.adopted),
        (1, 0, 0),
        "a compaction is in hand, none done: {stats:?}"
    );
    // Every commit went through without it, each on all the runs before.
    for id in 1..=6 {
        let m = store.reader().manifest(id).unwrap();
        let runs = &state_entry(&m).runs;
        assert_eq!(runs.len(), id as usize, "checkpoint {id}: nothing merged");
        assert!(runs.iter().all(|r| r.merges == vec![r.checkpoint]));
        assert_eq!(state_of(store.reader(), id), at[&id]);
    }
    assert!(
        !store.wait_for_compactions(Duration::from_millis(50)),
        "held: not idle"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join(COMPACTING_DIR))
            .unwrap()
            .count(),
        0
    );
    // Released, it merges (the wait bounded by WAIT), and the next commit
    // adopts its output.
    drop(hold);
    assert!(store.wait_for_compactions(WAIT));
    assert_eq!(store.compaction_stats().merged, 1);
    at.extend(write(&store, &mut t, 7..=7, &mut model));
    let stats = store.compaction_stats();
    assert_eq!(
        (stats.adopted, stats.discarded, stats.failed),
        (1, 0, 0),
        "{stats:?}"
    );
    let m = store.reader().manifest(7).unwrap();
    assert!(
        state_entry(&m).runs.iter().any(|r| r.merges.len() > 1),
        "{:?}",
        state_entry(&m).runs
    );
    for id in 1..=7 {
        store.reader().verify(id).unwrap();
        assert_eq!(state_of(store.reader(), id), at[&id], "checkpoint {id}");
    }
}

#[test]
fn dropping_the_store_abandons_a_held_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), options(10, 1)).unwrap();
    let hold = store.hold_compactions().unwrap();
    let mut t = table(u32::MAX);
    let mut model = BTreeMap::new();
    let at = write(&store, &mut t, 1..=3, &mut model);
    let stats = store.compaction_stats();
    assert_eq!((stats.submitted, stats.merged), (1, 0), "{stats:?}");
    // The drop stops the job waiting at the hold (the hold still alive):
    // it returns (bounded by COMPACTION_SHUTDOWN_TIMEOUT either way) and
    // the job stages nothing.
    drop(store);
    let left: Vec<_> = std::fs::read_dir(dir.path().join(COMPACTING_DIR))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "nothing staged: {left:?}");
    drop(hold);
    let reader = SnapshotReader::open(dir.path()).unwrap();
    assert_eq!(reader.list().unwrap(), vec![1, 2, 3]);
    for id in 1..=3 {
        assert_eq!(state_of(&reader, id), at[&id]);
    }
}

#[test]
fn retention_keeps_the_runs_of_kept_checkpoints_and_of_compactions_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), options(1, 2)).unwrap();
    // Held until checkpoint 4 is committed: the merge is in flight then,
    // however fast the compactor would be.
    let hold = store.hold_compactions().unwrap();
    let mut t = table(u32::MAX);
    let mut model = BTreeMap::new();
    write(&store, &mut t, 1..=3, &mut model);
    // 3 lists runs [3, 2, 1]: retain 1 keeps 3, and holds the directories
    // of 1 and 2 for their runs only.
    let reader = store.reader();
    let held_ids = || reader.held().unwrap().keys().copied().collect::<Vec<_>>();
    assert_eq!(reader.list().unwrap(), vec![3]);
    assert_eq!(held_ids(), vec![1, 2]);
    assert_eq!(store.held(), reader.held().unwrap());
    assert!(reader.partial().unwrap().is_empty());
    // A full capture at 4 needs none of them, but the tier merge of 2 and
    // 3 (handed over at 3) still reads their files; 1 goes.
    t.checkpoint_aborted();
    write(&store, &mut t, 4..=4, &mut model);
    assert_eq!(state_entry(&reader.manifest(4).unwrap()).runs.len(), 1);
    assert_eq!(reader.list().unwrap(), vec![4]);
    assert_eq!(held_ids(), vec![2, 3]);
    let inputs: BTreeSet<u64> = store.compaction_inputs().iter().map(|(c, _)| *c).collect();
    assert_eq!(inputs, BTreeSet::from([2, 3]));
    let stats = store.compaction_stats();
    assert_eq!((stats.submitted, stats.merged), (1, 0), "{stats:?}");
    drop(hold);
    assert!(store.wait_for_compactions(WAIT));
    let at5 = write(&store, &mut t, 5..=5, &mut model);
    let stats = store.compaction_stats();
    assert_eq!((stats.merged, stats.adopted, stats.discarded), (1, 0, 1));
    // Its output discarded, nothing reads 2 and 3 any more; 5 reads 4's full.
    assert_eq!(reader.list().unwrap(), vec![5]);
    assert_eq!(held_ids(), vec![4]);
    assert_eq!(state_of(reader, 5), at5[&5]);

    // After a base merge, a kept checkpoint reads the adopter's directory
    // and no longer the merged ones; only the directories it reads stay.
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), options(1, 2)).unwrap();
    let mut t = table(u32::MAX);
    let mut model = BTreeMap::new();
    write(&store, &mut t, 1..=3, &mut model);
    assert!(store.wait_for_compactions(WAIT));
    let at = write(&store, &mut t, 4..=5, &mut model);
    let m = store.reader().manifest(5).unwrap();
    let read: BTreeSet<u64> = m.reads().iter().map(|(c, _)| *c).collect();
    let mut on_disk: BTreeSet<u64> = store.reader().held().unwrap().into_keys().collect();
    on_disk.extend(store.reader().list().unwrap());
    assert_eq!(on_disk, read);
    assert!(!read.contains(&2) && !read.contains(&3), "{read:?}");
    assert_eq!(m.needs(), vec![5]);
    assert_eq!(state_of(store.reader(), 5), at[&5]);
    // Every file of a held directory is one 5 reads.
    for (id, files) in store.reader().held().unwrap() {
        for f in files {
            assert!(m.reads().contains(&(id, f.clone())), "{id} {f}");
        }
    }
}

#[test]
fn a_restored_table_diffs_on_top_of_merged_runs() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), options(10, 2)).unwrap();
    let mut t = table(u32::MAX);
    let mut model = BTreeMap::new();
    write(&store, &mut t, 1..=3, &mut model);
    assert!(store.wait_for_compactions(WAIT));
    write(&store, &mut t, 4..=4, &mut model);
    drop(store);
    // A restarted job: the chain it restores from has a merged run.
    let store = SnapshotStore::open(dir.path(), options(10, 2)).unwrap();
    let chain = store.reader().state_chain(4, &agg()).unwrap();
    assert_eq!(
        chain.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![1, 3, 4]
    );
    let mut t = restored(store.reader(), 4);
    let at = write(&store, &mut t, 5..=6, &mut model);
    for id in 5..=6 {
        assert_eq!(state_of(store.reader(), id), at[&id]);
    }
}

#[test]
fn a_state_whose_runs_cannot_merge_is_left_as_it_is() {
    use arrow_array::{BooleanArray, Float64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};
    use snapcut_core::snapshot::{StateCapture, StateKind};
    use snapcut_core::state::{DELETED_COLUMN, KEY_METADATA};
    use std::sync::Arc;

    // Float keys: the chain rebuilds them, runs do not order them.
    let batch = |keys: Vec<f64>, diff: bool| {
        let mut fields = vec![
            Field::new("k", DataType::Float64, false),
            Field::new("v", DataType::Int64, false),
        ];
        let n = keys.len();
        let mut cols: Vec<Arc<dyn arrow_array::Array>> = vec![
            Arc::new(Float64Array::from(keys)),
            Arc::new(Int64Array::from(vec![1; n])),
        ];
        if diff {
            fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
            cols.push(Arc::new(BooleanArray::from(vec![false; n])));
        }
        let schema =
            Schema::new_with_metadata(fields, [(KEY_METADATA.to_string(), "k".to_string())].into());
        RecordBatch::try_new(Arc::new(schema), cols).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), options(10, 1)).unwrap();
    for id in 1..=4u64 {
        let state = StateCapture {
            kind: match id {
                1 => StateKind::Full,
                _ => StateKind::Diff { base: id - 1 },
            },
            batch: batch(vec![id as f64, 0.5], id > 1),
            filter: None,
            times: None,
        };
        commit_capture(&store, id, state);
    }
    let stats = store.compaction_stats();
    assert_eq!(
        (stats.submitted, stats.failed, stats.refused, stats.adopted),
        (1, 1, 1, 0),
        "tried once, then left alone: {stats:?}"
    );
    let state = store.reader().state(4, &agg()).unwrap().unwrap();
    assert_eq!(state.num_rows(), 5, "keys 0.5 and 1..=4");
    assert_eq!(
        state_entry(&store.reader().manifest(4).unwrap()).runs.len(),
        4
    );
}

/// Commits checkpoint `id` with task agg-0's state `capture` alone, then
/// waits for the compactions the commit handed over.
fn commit_capture(store: &SnapshotStore, id: u64, capture: snapcut_core::snapshot::StateCapture) {
    commit_state(store, id, Some(capture), None);
    assert!(store.wait_for_compactions(WAIT));
}

/// A state with a nested column (a list a key), which a file cannot be
/// streamed with: the compactor merges it in memory, and the merged runs
/// restore what was captured.
#[test]
fn a_state_with_a_nested_column_is_compacted_whole() {
    use arrow_array::builder::{Int64Builder, ListBuilder};
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{Array, BooleanArray, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};
    use snapcut_core::snapshot::{StateCapture, StateKind};
    use snapcut_core::state::{DELETED_COLUMN, KEY_METADATA};
    use std::sync::Arc;

    let item = Arc::new(Field::new("item", DataType::Int64, true));
    let fields = vec![
        Field::new("k", DataType::Int64, false),
        Field::new("xs", DataType::List(item), true),
    ];
    let metadata = [(KEY_METADATA.to_string(), "k".to_string())].into();
    let full_schema = Arc::new(Schema::new_with_metadata(fields.clone(), metadata));
    let mut diff_fields = fields;
    diff_fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
    let diff_schema = Arc::new(Schema::new_with_metadata(
        diff_fields,
        full_schema.metadata().clone(),
    ));
    // Key k holds [k, k + id]; a diff's tombstones delete.
    let lists = |keys: &[i64], id: i64| {
        let mut b = ListBuilder::new(Int64Builder::new());
        for &k in keys {
            b.values().append_value(k);
            b.values().append_value(k + id);
            b.append(true);
        }
        Arc::new(b.finish()) as Arc<dyn Array>
    };
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), options(10, 2)).unwrap();
    let mut model: BTreeMap<i64, i64> = BTreeMap::new();
    for id in 1..=4u64 {
        let capture = if id == 1 {
            let keys: Vec<i64> = (0..50).collect();
            model.extend(keys.iter().map(|&k| (k, 1)));
            let batch = RecordBatch::try_new(
                full_schema.clone(),
                vec![Arc::new(Int64Array::from(keys.clone())), lists(&keys, 1)],
            )
            .unwrap();
            StateCapture {
                kind: StateKind::Full,
                batch,
                filter: None,
                times: None,
            }
        } else {
            // Ten keys rewritten (in descending order: not sorted), one gone.
            let start = 10 * id as i64;
            let keys: Vec<i64> = (start..start + 10).rev().collect();
            let gone = start - 15;
            let mut all = keys.clone();
            all.push(gone);
            let mut deleted = vec![false; keys.len()];
            deleted.push(true);
            model.extend(keys.iter().map(|&k| (k, id as i64)));
            model.remove(&gone);
            let batch = RecordBatch::try_new(
                diff_schema.clone(),
                vec![
                    Arc::new(Int64Array::from(all.clone())),
                    lists(&all, id as i64),
                    Arc::new(BooleanArray::from(deleted)),
                ],
            )
            .unwrap();
            StateCapture {
                kind: StateKind::Diff { base: id - 1 },
                batch,
                filter: None,
                times: None,
            }
        };
        commit_capture(&store, id, capture);
    }
    let stats = store.compaction_stats();
    assert!(stats.adopted >= 1 && stats.failed == 0, "{stats:?}");
    let m = store.reader().manifest(4).unwrap();
    assert!(
        state_entry(&m).runs.iter().any(|r| r.merges.len() > 1),
        "a merged run is listed: {:?}",
        state_entry(&m).runs
    );
    // The state at 4, rebuilt from the runs: each key's list is [k, k + id].
    let state = store.reader().state(4, &agg()).unwrap().unwrap();
    let keys = state
        .column_by_name("k")
        .unwrap()
        .as_primitive::<Int64Type>();
    let xs = state.column_by_name("xs").unwrap().as_list::<i32>();
    let got: BTreeMap<i64, i64> = (0..state.num_rows())
        .map(|i| {
            let k = keys.value(i);
            let list = xs.value(i);
            let list = list.as_primitive::<Int64Type>();
            assert_eq!(list.value(0), k);
            (k, list.value(1) - k)
        })
        .collect();
    assert_eq!(got, model);
}

/// Task agg-0's capture at checkpoint `id` of a chain over `keys` (more
/// than a streamed file's chunk, in an order no sort gives): at 1 a full
/// in capture order (an in-memory aggregate's), after it a diff that
/// rewrites ten keys and deletes one; `model` follows.
fn capture_order_capture(
    keys: &[i64],
    id: u64,
    model: &mut BTreeMap<i64, i64>,
) -> snapcut_core::snapshot::StateCapture {
    use arrow_array::RecordBatch;
    use arrow_schema::Schema;
    use snapcut_core::snapshot::{StateCapture, StateKind};
    use snapcut_core::state::KEY_METADATA;
    use std::sync::Arc;

    let metadata: std::collections::HashMap<String, String> =
        [(KEY_METADATA.to_string(), "k".to_string())].into();
    if id == 1 {
        model.extend(keys.iter().map(|&k| (k, k)));
        let full_schema = Arc::new(Schema::new_with_metadata(
            schema().fields().clone(),
            metadata,
        ));
        let batch = rows(keys.iter().copied(), 0);
        return StateCapture {
            kind: StateKind::Full,
            batch: RecordBatch::try_new(full_schema, batch.columns().to_vec()).unwrap(),
            filter: None,
            times: None,
        };
    }
    let changed: Vec<i64> = (0..10).map(|i| keys[(id as usize) * 1000 + i]).collect();
    diff_capture(&changed, keys[id as usize * 7], id, model)
}

/// Task agg-0's diff at checkpoint `id` (on `id - 1`): `changed` rewritten
/// to `k + 100 id`, `gone` deleted; `model` follows.
fn diff_capture(
    changed: &[i64],
    gone: i64,
    id: u64,
    model: &mut BTreeMap<i64, i64>,
) -> snapcut_core::snapshot::StateCapture {
    use arrow_array::{BooleanArray, RecordBatch};
    use arrow_schema::{DataType, Field, FieldRef, Schema};
    use snapcut_core::snapshot::{StateCapture, StateKind};
    use snapcut_core::state::{DELETED_COLUMN, KEY_METADATA};
    use std::sync::Arc;

    let metadata: std::collections::HashMap<String, String> =
        [(KEY_METADATA.to_string(), "k".to_string())].into();
    let mut diff_fields: Vec<FieldRef> = schema().fields().iter().cloned().collect();
    diff_fields.push(Arc::new(Field::new(
        DELETED_COLUMN,
        DataType::Boolean,
        false,
    )));
    let diff_schema = Arc::new(Schema::new_with_metadata(diff_fields, metadata));
    let mut all = changed.to_vec();
    all.push(gone);
    let batch = rows(all, 100 * id as i64);
    let mut deleted = vec![false; changed.len()];
    deleted.push(true);
    for &k in changed {
        model.insert(k, k + 100 * id as i64);
    }
    model.remove(&gone);
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(BooleanArray::from(deleted)));
    StateCapture {
        kind: StateKind::Diff { base: id - 1 },
        batch: RecordBatch::try_new(diff_schema, columns).unwrap(),
        filter: None,
        times: None,
    }
}

/// 150,001 keys (more than a streamed file's chunk, 65,536) in an order no
/// sort gives (7919 is prime to N: a permutation).
fn permuted_keys() -> Vec<i64> {
    const N: i64 = 150_001;
    (0..N).map(|i| (i * 7919) % N).collect()
}

/// Whether checkpoint `id` of agg-0 lists a base that merged runs (a full
/// written by a base merge, not by the task).
fn lists_merged_base(store: &SnapshotStore, id: u64) -> bool {
    let m = store.reader().manifest(id).unwrap();
    state_entry(&m)
        .runs
        .iter()
        .any(|r| r.kind == FileKind::Full && r.merges.len() > 1)
}

/// The names under `compacting/` ending in `suffix`.
fn compacting_files(root: &std::path::Path, suffix: &str) -> Vec<String> {
    fs::read_dir(root.join(COMPACTING_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(suffix))
        .collect()
}

/// A full in capture order (an in-memory aggregate's) is sorted for its
/// base merge through a file of the staging directory, a chunk at a time,
/// not in memory: the merged base restores what was captured, and no
/// scratch file is left behind.
#[test]
fn a_full_in_capture_order_is_merged_through_a_sorted_staging_file() {
    let keys = permuted_keys();
    let dir = tempfile::tempdir().unwrap();
    // One diff on the full calls for a base merge.
    let store = SnapshotStore::open(dir.path(), options(10, 1)).unwrap();
    let mut model = BTreeMap::new();
    for id in 1..=4u64 {
        let capture = capture_order_capture(&keys, id, &mut model);
        commit_capture(&store, id, capture);
    }
    let stats = store.compaction_stats();
    assert!(stats.adopted >= 1 && stats.failed == 0, "{stats:?}");
    assert!(
        lists_merged_base(&store, 4),
        "the full merged into a new base: {:?}",
        state_entry(&store.reader().manifest(4).unwrap()).runs
    );
    store.reader().verify(4).unwrap();
    assert_eq!(state_of(store.reader(), 4), model);
    let left = compacting_files(dir.path(), ".sorted.tmp");
    assert!(left.is_empty(), "scratch files left: {left:?}");
}

/// The sorted scratch copy cannot be written (here a directory stands at
/// its name, as a full disk or an unwritable `compacting/` would fail
/// it): the job counts as failed, nothing is adopted, every checkpoint
/// restores what it captured and nothing is left under `compacting/`;
/// once the copy can be written, a later commit plans the merge again.
#[test]
fn a_sorted_copy_that_cannot_be_written_fails_the_job_and_loses_nothing() {
    let keys = permuted_keys();
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), options(10, 1)).unwrap();
    let mut model = BTreeMap::new();
    let capture = capture_order_capture(&keys, 1, &mut model);
    commit_capture(&store, 1, capture);
    let full = state_entry(&store.reader().manifest(1).unwrap()).runs[0].clone();
    assert_eq!(full.kind, FileKind::Full);
    let blocker = dir
        .path()
        .join(COMPACTING_DIR)
        .join(format!("{}-{}.sorted.tmp", full.checkpoint, full.path));
    fs::create_dir_all(&blocker).unwrap();
    let mut models = vec![model.clone()];
    for id in 2..=3u64 {
        let capture = capture_order_capture(&keys, id, &mut model);
        commit_capture(&store, id, capture);
        models.push(model.clone());
    }
    let stats = store.compaction_stats();
    assert!(
        stats.failed >= 1 && stats.refused == 0,
        "the merge failed, and is not refused for good: {stats:?}"
    );
    for id in 1..=3u64 {
        store.reader().verify(id).unwrap();
        assert_eq!(state_of(store.reader(), id), models[id as usize - 1]);
    }
    assert!(
        !lists_merged_base(&store, 3),
        "no merged base listed: {:?}",
        state_entry(&store.reader().manifest(3).unwrap()).runs
    );
    // (A tier merge of the diffs needs no sorted copy: its output may wait
    // there for the next commit.)
    let left: Vec<String> = compacting_files(dir.path(), ".tmp")
        .into_iter()
        .filter(|n| blocker.file_name().unwrap() != n.as_str())
        .collect();
    assert!(left.is_empty(), "scratch files left: {left:?}");

    // Once the copy can be written, a diff that outgrows a quarter of the
    // full calls for a base merge again, and a later commit adopts it.
    fs::remove_dir(&blocker).unwrap();
    let capture = diff_capture(&keys[..40_000], keys[40_007], 4, &mut model);
    commit_capture(&store, 4, capture);
    // (A tier merge handed over before may be adopted first.)
    let mut last = 4;
    while !lists_merged_base(&store, last) {
        last += 1;
        assert!(
            last <= 8,
            "no base merge adopted by checkpoint 8: {:?}",
            store.compaction_stats()
        );
        let capture = capture_order_capture(&keys, last, &mut model);
        commit_capture(&store, last, capture);
    }
    store.reader().verify(last).unwrap();
    assert_eq!(state_of(store.reader(), last), model);
    assert!(compacting_files(dir.path(), ".sorted.tmp").is_empty());
}
