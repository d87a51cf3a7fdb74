//! `StateTable::with_time_index`: `due` follows upserts, deletes, group
//! deletes and diffs, skips null times, is rebuilt on restore and on an
//! index added to a full table; bad time columns are refused.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::{StatePolicy, StateTable, DELETED_COLUMN};
use crate::snapshot::StateKind;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("g", DataType::Utf8, false),
        Field::new("at", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
    ]))
}

fn rows(r: &[(&str, &str, Option<i64>)]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(StringArray::from_iter_values(r.iter().map(|x| x.0))),
            Arc::new(StringArray::from_iter_values(r.iter().map(|x| x.1))),
            Arc::new(Int64Array::from_iter(r.iter().map(|x| x.2))),
            Arc::new(StringArray::from_iter_values(r.iter().map(|x| x.0))),
        ],
    )
    .unwrap()
}

fn table() -> StateTable {
    StateTable::new(schema(), "k", StatePolicy::default())
        .unwrap()
        .with_group("g")
        .unwrap()
        .with_time_index("at")
        .unwrap()
}

fn due(t: &mut StateTable, threshold: i64) -> Vec<String> {
    let keys = t.due(threshold).unwrap();
    keys.as_string::<i32>()
        .iter()
        .map(|k| k.unwrap().to_string())
        .collect()
}

/// A model's keys due by `threshold`, by time then key.
fn due_in(model: &std::collections::BTreeMap<String, i64>, threshold: i64) -> Vec<String> {
    let mut due: Vec<(i64, String)> = (model.iter())
        .filter(|(_, at)| **at <= threshold)
        .map(|(k, at)| (*at, k.clone()))
        .collect();
    due.sort();
    due.into_iter().map(|(_, k)| k).collect()
}

#[test]
fn due_keys_follow_writes_deletes_and_null_times() {
    let mut t = table();
    assert_eq!(t.time_column(), Some("at"));
    t.upsert(&rows(&[
        ("a", "x", Some(30)),
        ("b", "x", Some(10)),
        ("c", "y", None),
        ("d", "y", Some(10)),
        ("b", "x", Some(20)), // the later row of a key wins
    ]))
    .unwrap();
    assert_eq!(due(&mut t, 9), Vec::<String>::new());
    assert_eq!(due(&mut t, 20), ["d", "b"]);
    assert_eq!(t.earliest_time().unwrap(), Some(10));
    t.upsert(&rows(&[("d", "y", None), ("c", "y", Some(5))]))
        .unwrap();
    assert_eq!(due(&mut t, 25), ["c", "b"]);
    t.delete(&StringArray::from(vec!["c", "zz"])).unwrap();
    t.delete_groups(&StringArray::from(vec!["x"])).unwrap();
    assert_eq!(due(&mut t, i64::MAX), Vec::<String>::new());
    assert_eq!(t.earliest_time().unwrap(), None);
}

#[test]
fn restore_and_diffs_rebuild_the_index() {
    let mut t = table();
    // p, q, r stay untouched (and not due by 10): the second capture
    // changes under half the keys, so it is a diff.
    let later = [
        ("p", "z", Some(100)),
        ("q", "z", Some(100)),
        ("r", "z", Some(100)),
    ];
    t.upsert(&rows(&[("a", "x", Some(1)), ("b", "x", Some(2))]))
        .unwrap();
    t.upsert(&rows(&later)).unwrap();
    let full = t.checkpoint(1).unwrap();
    t.upsert(&rows(&[("c", "y", Some(3))])).unwrap();
    t.delete(&StringArray::from(vec!["a"])).unwrap();
    let diff = t.checkpoint(2).unwrap();
    assert_eq!(diff.kind, StateKind::Diff { base: 1 });
    let mut back = table();
    back.restore(&[(1, full), (2, diff)]).unwrap();
    assert_eq!(due(&mut back, 10), ["b", "c"]);
    // A diff applied by hand: its tombstones leave the index too.
    let mut tomb = rows(&[("b", "x", None)]).columns().to_vec();
    tomb.push(Arc::new(BooleanArray::from(vec![true])));
    let mut fields: Vec<Field> = schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
    let tomb = RecordBatch::try_new(Arc::new(Schema::new(fields)), tomb).unwrap();
    back.apply(&tomb, true).unwrap();
    assert_eq!(due(&mut back, 10), ["c"]);
}

#[test]
fn an_index_added_to_a_full_table_indexes_its_rows() {
    let mut t = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    t.upsert(&rows(&[("a", "x", Some(7)), ("b", "x", None)]))
        .unwrap();
    let mut t = t.with_time_index("at").unwrap();
    assert_eq!(due(&mut t, 7), ["a"]);
}

#[test]
fn bad_time_columns_are_refused_naming_the_fix() {
    let new = || StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    let err = |c: &str| new().with_time_index(c).unwrap_err().to_string();
    assert!(err("when").contains("time column 'when' is not in the state schema"));
    assert!(err("name").contains("must be an Int64 value column"));
    assert!(err("k").contains("not the key"));
    let mut plain = new();
    assert!(plain
        .due(0)
        .unwrap_err()
        .to_string()
        .contains("no time index"));
}

/// A budgeted table's index moves its entries into runs (a few entries in
/// memory here): `due` and `earliest_time` still agree with the rows after
/// updates (stale entries in the runs), deletes and merges of the runs, and
/// a run read to its end goes.
#[test]
fn a_spilled_index_agrees_with_the_rows_and_drops_what_it_read() {
    use std::collections::BTreeMap;

    use super::{InMemoryRuns, MIN_STATE_MEMORY};

    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("at", DataType::Int64, true),
    ]));
    let write = |t: &mut StateTable, r: &[(String, Option<i64>)]| {
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(
                    r.iter().map(|x| x.0.as_str()),
                )),
                Arc::new(Int64Array::from_iter(r.iter().map(|x| x.1))),
            ],
        )
        .unwrap();
        t.upsert(&batch).unwrap();
    };
    let mut t = StateTable::new(schema.clone(), "k", StatePolicy::default())
        .unwrap()
        .with_time_index("at")
        .unwrap()
        .with_memory_budget(MIN_STATE_MEMORY, Box::new(InMemoryRuns))
        .unwrap()
        .with_time_memory_entries(4);
    let mut model: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..100i64 {
        let key = format!("k{i:03}");
        write(&mut t, &[(key.clone(), Some(i % 10 * 10))]);
        model.insert(key, i % 10 * 10);
    }
    // Every other key moves later (its old entry goes stale), some lose
    // their time, some go.
    for i in (0..100i64).step_by(2) {
        let key = format!("k{i:03}");
        write(&mut t, &[(key.clone(), Some(1000 + i))]);
        model.insert(key, 1000 + i);
    }
    for i in (1..100i64).step_by(7) {
        let key = format!("k{i:03}");
        write(&mut t, &[(key.clone(), None)]);
        model.remove(&key);
    }
    let gone: Vec<String> = (3..100).step_by(11).map(|i| format!("k{i:03}")).collect();
    t.delete(&StringArray::from(gone.clone())).unwrap();
    gone.iter().for_each(|k| {
        model.remove(k);
    });
    let stats = t.spill_stats().unwrap();
    assert!(stats.time_flushes > 8 && stats.time_merges > 0, "{stats:?}");
    let want = |threshold: i64| due_in(&model, threshold);
    assert_eq!(t.earliest_time().unwrap(), model.values().min().copied());
    assert_eq!(due(&mut t, 35), want(35));
    // Asked again, the same keys: the valid entries the runs gave stay.
    assert_eq!(due(&mut t, 35), want(35));
    assert_eq!(due(&mut t, 1050), want(1050));
    assert_eq!(due(&mut t, i64::MAX), want(i64::MAX));
    // Every run was read to its end and went; the valid entries it gave
    // were more than memory holds: one new run.
    assert_eq!(t.time_runs(), 1);
    assert_eq!(t.earliest_time().unwrap(), model.values().min().copied());
}

/// A restore notes its base's times in one sweep, as one sorted run:
/// without a budget in memory, under one written a bucket of times at a
/// time (of about 4 entries here). Either way `due` agrees with the rows after the
/// restore and after writes that move, clear and delete times (the runs'
/// entries gone stale are checked against the rows).
#[test]
fn a_restore_notes_its_bases_times_in_one_sweep() {
    use std::collections::BTreeMap;

    use super::{InMemoryRuns, MIN_STATE_MEMORY};
    use crate::snapshot::StateCapture;

    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("at", DataType::Int64, true),
    ]));
    let batch = |r: &[(String, Option<i64>)]| {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(
                    r.iter().map(|x| x.0.as_str()),
                )),
                Arc::new(Int64Array::from_iter(r.iter().map(|x| x.1))),
            ],
        )
        .unwrap()
    };
    // 100 keys in key order, every tenth without a time: 90 entries.
    let base: Vec<(String, Option<i64>)> = (0..100i64)
        .map(|i| (format!("k{i:03}"), (i % 10 != 9).then_some((i * 37) % 100)))
        .collect();
    // A plain restore (the base applied into memory) notes it the same way.
    for (budgeted, mapped) in [(false, true), (true, true), (false, false)] {
        let mut t = StateTable::new(schema.clone(), "k", StatePolicy::default())
            .unwrap()
            .with_time_index("at")
            .unwrap();
        if budgeted {
            t = t
                .with_memory_budget(MIN_STATE_MEMORY, Box::new(InMemoryRuns))
                .unwrap()
                .with_time_memory_entries(4);
        }
        let full = StateCapture {
            kind: StateKind::Full,
            batch: batch(&base),
            filter: None,
            times: None,
        };
        if mapped {
            t.restore_mapped(&[(1, full)]).unwrap();
        } else {
            t.restore(&[(1, full)]).unwrap();
            assert!(t.spill_stats().is_none());
        }
        let mut model: BTreeMap<String, i64> = base
            .iter()
            .filter_map(|(k, at)| at.map(|at| (k.clone(), at)))
            .collect();
        if budgeted {
            // 90 entries in buckets of about 4: one run, written once.
            let stats = t.spill_stats().unwrap();
            assert_eq!((stats.time_flushes, stats.time_merges), (1, 0), "{stats:?}");
            assert_eq!(t.time_runs(), 1);
        } else {
            // One run in memory (no sink writes it), counted as memory by
            // a lazily opened table: 90 entries of a time and a 4-byte key.
            assert_eq!(t.time_runs(), 1);
            if mapped {
                let stats = t.spill_stats().expect("a mapped restore opens lazily");
                assert!(stats.memtable_bytes >= 90 * 12, "{stats:?}");
            }
        }
        assert_eq!(t.earliest_time().unwrap(), model.values().min().copied());
        assert_eq!(due(&mut t, 20), due_in(&model, 20), "budgeted {budgeted}");
        // Every third key moves later, every seventh loses its time.
        let mut writes = Vec::new();
        for i in (0..100i64).step_by(3) {
            writes.push((format!("k{i:03}"), Some(500 + i)));
        }
        for i in (1..100i64).step_by(7) {
            writes.push((format!("k{i:03}"), None));
        }
        for (k, at) in &writes {
            t.upsert(&batch(&[(k.clone(), *at)])).unwrap();
            match at {
                Some(at) => model.insert(k.clone(), *at),
                None => model.remove(k),
            };
        }
        let gone: Vec<String> = (5..100).step_by(13).map(|i| format!("k{i:03}")).collect();
        t.delete(&StringArray::from(gone.clone())).unwrap();
        gone.iter().for_each(|k| {
            model.remove(k);
        });
        for threshold in [20, 60, 99, 550, i64::MAX] {
            assert_eq!(
                due(&mut t, threshold),
                due_in(&model, threshold),
                "budgeted {budgeted}, due by {threshold}"
            );
        }
    }
}

/// The base's one run under a budget is a file the sink writes as the
/// buckets come, in chunks that span them (a streamed file's chunks but its
/// last hold what was asked): 150k int keys with random times (ties among
/// them), buckets of about 1,000 entries. `due` then gives the model's keys.
#[test]
fn a_budgeted_restore_writes_its_bases_times_as_one_file() {
    use super::MIN_STATE_MEMORY;
    use crate::snapshot::StateCapture;
    use crate::store::LocalRuns;

    let schema: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("at", DataType::Int64, true),
    ]));
    let n = 150_000i64;
    // A multiplicative hash: times spread over 0..5,000 with ties, every
    // eleventh null.
    let time = |k: i64| (k % 11 != 0).then_some((k * 2_654_435_761) % 5_000);
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..n)),
            Arc::new(Int64Array::from_iter((0..n).map(time))),
        ],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut t = StateTable::new(schema, "k", StatePolicy::default())
        .unwrap()
        .with_time_index("at")
        .unwrap()
        .with_memory_budget(
            MIN_STATE_MEMORY,
            Box::new(LocalRuns::new(dir.path()).unwrap()),
        )
        .unwrap()
        .with_time_memory_entries(1_000);
    let full = StateCapture {
        kind: StateKind::Full,
        batch,
        filter: None,
        times: None,
    };
    t.restore_mapped(&[(1, full)]).unwrap();
    let stats = t.spill_stats().unwrap();
    assert_eq!(
        (stats.time_flushes, stats.time_merges, stats.time_runs),
        (1, 0, 1)
    );
    let mut model: Vec<(i64, i64)> = (0..n).filter_map(|k| time(k).map(|t| (t, k))).collect();
    model.sort_unstable();
    for threshold in [-1, 0, 1_234, 4_999] {
        let keys = t.due(threshold).unwrap();
        let got: Vec<i64> = keys
            .as_primitive::<arrow_array::types::Int64Type>()
            .values()
            .to_vec();
        let want: Vec<i64> = (model.iter())
            .take_while(|(at, _)| *at <= threshold)
            .map(|(_, k)| *k)
            .collect();
        assert_eq!(got, want, "due by {threshold}");
    }
}
