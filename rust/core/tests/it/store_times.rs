//! A full of a table with a time index stores the index beside its file
//! (format 5): written by the store's writer from the file (a capture in
//! memory or a budgeted table's runs), listed in the manifest and in the
//! runs of later checkpoints, checked by `verify`, and taken by a restore
//! as the index's base run; a corrupt one is named and refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use snapcut_core::snapshot::{StateCapture, StateRuns};
use snapcut_core::state::{CaptureRows, StatePolicy, StateTable, TIME_METADATA};
use snapcut_core::store::{LocalRuns, SnapshotStore, StoreOptions};

use super::store_common::{commit_state, replace_file, task};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("at", DataType::Int64, true),
    ]))
}

/// Key `k`'s time: `(k * 7 + add) % 5000`, none for every 10th key.
fn time_of(k: i64, add: i64) -> Option<i64> {
    (k % 10 != 0).then_some((k * 7 + add) % 5000)
}

fn rows(keys: &[i64], add: i64) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(keys.to_vec())),
            Arc::new(Int64Array::from_iter(keys.iter().map(|&k| time_of(k, add)))),
        ],
    )
    .unwrap()
}

fn timed_table(budget: Option<&std::path::Path>) -> StateTable {
    let t = StateTable::new(schema(), "k", StatePolicy { full_every: 3 })
        .unwrap()
        .with_time_index("at")
        .unwrap();
    match budget {
        Some(dir) => t
            .with_memory_budget(1 << 20, Box::new(LocalRuns::new(dir).unwrap()))
            .unwrap(),
        None => t,
    }
}

/// The keys a model of key → time holds due by `threshold`, by time then key.
fn due_in(model: &BTreeMap<i64, i64>, threshold: i64) -> Vec<i64> {
    let mut due: Vec<(i64, i64)> = (model.iter())
        .filter(|(_, at)| **at <= threshold)
        .map(|(k, at)| (*at, *k))
        .collect();
    due.sort_unstable();
    due.into_iter().map(|(_, k)| k).collect()
}

fn due(t: &mut StateTable, threshold: i64) -> Vec<i64> {
    let keys = t.due(threshold).unwrap();
    keys.as_primitive::<Int64Type>().values().to_vec()
}

/// Checkpoints `t` (streamed: a budgeted table's full leaves its runs) as
/// task agg-0 and commits.
fn checkpoint(store: &SnapshotStore, t: &mut StateTable, id: u64) {
    let capture = t.checkpoint_streamed(id).unwrap();
    let (state, state_runs) = match capture.rows {
        CaptureRows::Batch(batch) => (
            Some(StateCapture {
                kind: capture.kind,
                batch,
                filter: None,
                times: None,
            }),
            None,
        ),
        CaptureRows::Runs { runs, schema, .. } => (
            None,
            Some(StateRuns {
                kind: capture.kind,
                runs,
                schema,
            }),
        ),
    };
    commit_state(store, id, state, state_runs);
}

/// Writes 30,000 keys (then rewrites a third and deletes some) through two
/// checkpoints, and returns the model of key → time.
fn write_two(store: &SnapshotStore, t: &mut StateTable) -> BTreeMap<i64, i64> {
    let keys: Vec<i64> = (0..30_000).collect();
    t.upsert(&rows(&keys, 0)).unwrap();
    checkpoint(store, t, 1);
    let changed: Vec<i64> = (0..30_000).step_by(3).collect();
    t.upsert(&rows(&changed, 11)).unwrap();
    let gone: Vec<i64> = (1..30_000).step_by(17).collect();
    t.delete(&Int64Array::from(gone.clone())).unwrap();
    checkpoint(store, t, 2);
    let mut model = BTreeMap::new();
    for &k in &keys {
        let add = if k % 3 == 0 { 11 } else { 0 };
        if let Some(at) = time_of(k, add) {
            model.insert(k, at);
        }
    }
    for k in gone {
        model.remove(&k);
    }
    model
}

fn restored(
    chain: &[(u64, StateCapture)],
    mapped: bool,
    budget: Option<&std::path::Path>,
) -> StateTable {
    let mut t = timed_table(budget);
    if mapped {
        t.restore_mapped(chain).unwrap();
    } else {
        t.restore(chain).unwrap();
    }
    t
}

#[test]
fn a_timed_full_stores_its_index_and_a_restore_takes_it() {
    for budgeted in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let spill = tempfile::tempdir().unwrap();
        let store = SnapshotStore::open(dir.path(), StoreOptions::default()).unwrap();
        let mut t = timed_table(budgeted.then_some(spill.path()));
        let model = write_two(&store, &mut t);
        if budgeted {
            assert!(t.spill_stats().unwrap().flushes > 0, "the budget spilled");
        }
        let reader = store.reader();
        let m1 = reader.manifest(1).unwrap();
        let full = m1.state_file(&task("agg", 0)).unwrap();
        let times = full.times.clone().expect("a timed full stores its index");
        assert_eq!(times.path, "agg-0.state.times.arrow");
        assert_eq!((times.column.as_str(), times.rows), ("at", 27_000));
        // The diff's runs name its base's index; the diff has none.
        let m2 = reader.manifest(2).unwrap();
        let diff = m2.state_file(&task("agg", 0)).unwrap();
        assert!(diff.times.is_none());
        assert_eq!(diff.runs.last().unwrap().times.as_ref(), Some(&times));
        reader.verify(2).unwrap();
        for mapped in [false, true] {
            let chain = match mapped {
                true => reader.state_runs(2, &task("agg", 0)).unwrap(),
                false => reader.state_chain(2, &task("agg", 0)).unwrap(),
            };
            let index = chain[0]
                .1
                .times
                .as_ref()
                .expect("the chain's full carries it");
            let column = index.schema().metadata().get(TIME_METADATA).cloned();
            assert_eq!(column.as_deref(), Some("at"));
            // Into a table with a budget too (an index read into memory goes
            // to its sink as a run).
            for into_budget in [None, Some(spill.path())] {
                let mut r = restored(&chain, mapped, into_budget);
                // A table with runs (a mapped or a budgeted one) counts it.
                let stats = r.spill_stats().map(|s| s.times_stored);
                let runs = mapped || into_budget.is_some();
                assert_eq!(
                    stats,
                    runs.then_some(1),
                    "mapped {mapped}, into {into_budget:?}"
                );
                for threshold in [-1, 0, 700, 2500, 4999] {
                    assert_eq!(
                        due(&mut r, threshold),
                        due_in(&model, threshold),
                        "budgeted {budgeted}, mapped {mapped}, into {into_budget:?}, \
                         threshold {threshold}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_stored_index_that_is_not_the_fulls_is_refused_and_another_columns_is_not_taken() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), StoreOptions::default()).unwrap();
    let mut t = timed_table(None);
    let model = write_two(&store, &mut t);
    let reader = store.reader();
    let chain = reader.state_chain(2, &task("agg", 0)).unwrap();
    // Another full's index (one entry fewer): its count gives it away.
    let mut wrong = chain.clone();
    let index = wrong[0].1.times.clone().unwrap();
    wrong[0].1.times = Some(index.slice(1, index.num_rows() - 1));
    let err = timed_table(None).restore(&wrong).unwrap_err().to_string();
    assert!(
        err.contains("holds 26999 entries, but the full has 27000 rows with a 'at'"),
        "{err}"
    );
    // One whose entries are out of order (a foreign or broken writer's).
    let mut reversed = chain.clone();
    let keys = index.column(0).as_binary::<i32>();
    let backwards =
        arrow_array::BinaryArray::from_iter_values((0..keys.len()).rev().map(|i| keys.value(i)));
    let columns = vec![Arc::new(backwards) as _, index.column(1).clone()];
    reversed[0].1.times = Some(RecordBatch::try_new(index.schema(), columns).unwrap());
    let err = timed_table(None)
        .restore(&reversed)
        .unwrap_err()
        .to_string();
    assert!(err.contains("out of order"), "{err}");
    // An index of another column is left aside: the rows' times are read.
    let mut other = chain.clone();
    let renamed = Arc::new(
        index
            .schema()
            .as_ref()
            .clone()
            .with_metadata([(TIME_METADATA.to_string(), "expires".to_string())].into()),
    );
    other[0].1.times = Some(RecordBatch::try_new(renamed, index.columns().to_vec()).unwrap());
    let mut r = restored(&other, false, None);
    assert_eq!(due(&mut r, 2500), due_in(&model, 2500));
}

#[test]
fn a_corrupt_stored_index_is_named_by_verify_and_refused_on_restore() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), StoreOptions::default()).unwrap();
    let mut t = timed_table(None);
    write_two(&store, &mut t);
    let reader = store.reader();
    let path = reader.checkpoint_dir(1).join("agg-0.state.times.arrow");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    replace_file(&path, &bytes);
    let err = reader.verify(2).unwrap_err().to_string();
    assert!(err.contains("agg-0.state.times.arrow"), "{err}");
    for mapped in [false, true] {
        let err = match mapped {
            true => reader.state_runs(2, &task("agg", 0)).unwrap_err(),
            false => reader.state_chain(2, &task("agg", 0)).unwrap_err(),
        };
        let err = err.to_string();
        assert!(
            err.contains("agg-0.state.times.arrow") && err.contains("checksum"),
            "{err}"
        );
    }
    // A rebuild reads no index: the state still reads.
    assert_eq!(
        reader
            .state(2, &task("agg", 0))
            .unwrap()
            .unwrap()
            .num_rows(),
        28_235
    );
}

/// A table keyed by strings, written in no key order: its stored index holds
/// each key's bytes after its time, and a restore finds the model's keys due.
#[test]
fn a_string_keyed_tables_stored_index_gives_its_due_keys() {
    use arrow_array::StringArray;

    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("at", DataType::Int64, true),
    ]));
    let table = || {
        StateTable::new(schema.clone(), "k", StatePolicy { full_every: 1 })
            .unwrap()
            .with_time_index("at")
            .unwrap()
    };
    let keys: Vec<String> = (0..5000)
        .map(|i| format!("user-{}", (i * 7919) % 5000))
        .collect();
    let at = |k: &str| -> Option<i64> {
        let n: i64 = k[5..].parse().unwrap();
        (n % 9 != 0).then_some((n * 31) % 1000)
    };
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from_iter_values(&keys)),
            Arc::new(Int64Array::from_iter(keys.iter().map(|k| at(k)))),
        ],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), StoreOptions::default()).unwrap();
    let mut t = table();
    t.upsert(&batch).unwrap();
    checkpoint(&store, &mut t, 1);
    let reader = store.reader();
    let entry = reader
        .manifest(1)
        .unwrap()
        .state_file(&task("agg", 0))
        .cloned()
        .unwrap();
    assert_eq!(entry.times.map(|x| x.rows), Some(5000 - 556));
    let mut model: Vec<(i64, String)> = (keys.iter())
        .filter_map(|k| Some((at(k)?, k.clone())))
        .collect();
    model.sort();
    for mapped in [false, true] {
        let chain = match mapped {
            true => reader.state_runs(1, &task("agg", 0)).unwrap(),
            false => reader.state_chain(1, &task("agg", 0)).unwrap(),
        };
        // The restore takes it (one entry short, it is refused).
        let mut short = chain.clone();
        let index = short[0].1.times.clone().unwrap();
        short[0].1.times = Some(index.slice(1, index.num_rows() - 1));
        assert!(table().restore(&short).is_err());
        let mut r = table();
        if mapped {
            r.restore_mapped(&chain).unwrap();
        } else {
            r.restore(&chain).unwrap();
        }
        let due = r.due(500).unwrap();
        let due: Vec<&str> = due.as_string::<i32>().iter().map(Option::unwrap).collect();
        let want: Vec<&str> = (model.iter())
            .filter(|(at, _)| *at <= 500)
            .map(|(_, k)| k.as_str())
            .collect();
        assert_eq!(due, want, "mapped {mapped}");
    }
}

/// A base merge of a timed full and its diff (the store's compactor) stores
/// the merged full's index beside it; the checkpoint that adopts it lists
/// it in its runs, `verify` checks it, and a restore takes it.
#[test]
fn a_merged_full_stores_its_index_and_a_restore_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        retain: 10,
        materialize_every: Some(1),
        ..Default::default()
    };
    let store = SnapshotStore::open(dir.path(), options).unwrap();
    let mut t = timed_table(None);
    let mut model = write_two(&store, &mut t);
    let timed_at_2 = model.len() as u64;
    // The diff holds more than a quarter of the full's rows: a base merge.
    assert!(store.wait_for_compactions(std::time::Duration::from_secs(60)));
    t.upsert(&rows(&[5], 3)).unwrap();
    model.insert(5, time_of(5, 3).unwrap());
    checkpoint(&store, &mut t, 3);
    let reader = store.reader();
    let entry = reader
        .manifest(3)
        .unwrap()
        .state_file(&task("agg", 0))
        .cloned()
        .unwrap();
    let base = entry.runs.last().unwrap();
    assert_eq!(
        (base.checkpoint, base.merges.clone()),
        (3, vec![1, 2]),
        "{:?}",
        entry.runs
    );
    let times = base
        .times
        .clone()
        .expect("a merged timed full stores its index");
    assert_eq!(times.path, "agg-0.run-1-2.state.times.arrow");
    assert_eq!((times.column.as_str(), times.rows), ("at", timed_at_2));
    assert!(reader.checkpoint_dir(3).join(&times.path).exists());
    reader.verify(3).unwrap();
    let chain = reader.state_runs(3, &task("agg", 0)).unwrap();
    assert!(
        chain[0].1.times.is_some(),
        "the restore is handed the index"
    );
    let mut r = restored(&chain, true, None);
    assert_eq!(r.spill_stats().map(|s| s.times_stored), Some(1));
    for threshold in [-1, 0, 700, 2500, 4999] {
        assert_eq!(
            due(&mut r, threshold),
            due_in(&model, threshold),
            "{threshold}"
        );
    }
}
