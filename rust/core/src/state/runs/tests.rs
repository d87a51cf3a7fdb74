//! Runs, run sets and merges on hand-made batches: their errors, and the
//! counts a lookup reports. Shared batch builders for [`super::model_tests`].

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Float64Array, Int32Array, Int64Array, RecordBatch,
    StringArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::keys::KeyRef;
use super::{merge, Run, RunSet, DEFAULT_FPP};
use crate::error::Error;
use crate::state::{Key, DELETED_COLUMN};

/// A table's schema: key `k`, values `v` (Int64) and `s` (Utf8).
pub(super) fn schema(key: DataType) -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", key, false),
        Field::new("v", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
    ]))
}

/// A row's `s` for its `v`, so both value columns are checked.
pub(super) fn text(v: i64) -> String {
    format!("s{v}")
}

/// A diff batch: a `None` value is a tombstone.
pub(super) fn diff(keys: ArrayRef, values: &[Option<i64>]) -> RecordBatch {
    let mut fields = schema(keys.data_type().clone()).fields().to_vec();
    fields.push(Arc::new(Field::new(
        DELETED_COLUMN,
        DataType::Boolean,
        false,
    )));
    let deleted: BooleanArray = values.iter().map(|v| Some(v.is_none())).collect();
    let texts: StringArray = values.iter().map(|v| v.map(text)).collect();
    let columns: Vec<ArrayRef> = vec![
        keys,
        Arc::new(Int64Array::from(values.to_vec())),
        Arc::new(texts),
        Arc::new(deleted),
    ];
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// A full batch (no `__deleted`): a base.
pub(super) fn full(keys: ArrayRef, values: &[i64]) -> RecordBatch {
    let texts: StringArray = values.iter().map(|&v| Some(text(v))).collect();
    let columns: Vec<ArrayRef> = vec![
        keys.clone(),
        Arc::new(Int64Array::from(values.to_vec())),
        Arc::new(texts),
    ];
    RecordBatch::try_new(schema(keys.data_type().clone()), columns).unwrap()
}

fn ints(keys: &[i64]) -> ArrayRef {
    Arc::new(Int64Array::from(keys.to_vec()))
}

fn run(keys: &[i64], values: &[Option<i64>]) -> Run {
    Run::from_unsorted(diff(ints(keys), values), "k", DEFAULT_FPP).unwrap()
}

fn message(result: Result<impl std::fmt::Debug, Error>) -> String {
    result.unwrap_err().to_string()
}

fn values(batch: &RecordBatch) -> Vec<Option<i64>> {
    batch.column(1).as_primitive::<Int64Type>().iter().collect()
}

#[test]
fn an_unsorted_diff_becomes_a_sorted_run_with_its_range_and_filter() {
    let r = run(&[5, -2, 9, 3], &[Some(50), None, Some(90), None]);
    assert_eq!(
        r.keys().as_primitive::<Int64Type>().values(),
        &[-2, 3, 5, 9]
    );
    assert_eq!(values(r.batch()), [None, None, Some(50), Some(90)]);
    let range = r.key_range().unwrap();
    assert_eq!((&range.min, &range.max), (&Key::Int(-2), &Key::Int(9)));
    assert_eq!((r.len(), r.tombstone_count(), r.is_base()), (4, 2, false));
    assert!(r.is_deleted(0) && !r.is_deleted(2));
    assert!([-2, 3, 5, 9].iter().all(|&k| r.may_contain(KeyRef::Int(k))));
    assert!(!r.may_contain(KeyRef::Int(10)) && !r.may_contain(KeyRef::Int(-3)));
    assert!(r.size_bytes() > r.filter().unwrap().len_bytes());
    assert_eq!(r.key_column(), "k");
    assert_eq!(r.data_fields().len(), 3);

    let base = Run::from_unsorted(full(ints(&[2, 1]), &[20, 10]), "k", 0.01).unwrap();
    assert!(base.is_base() && base.tombstones().is_none() && !base.is_deleted(0));
    assert_eq!(values(base.batch()), [Some(10), Some(20)]);
    let empty = run(&[], &[]);
    assert!(empty.is_empty() && empty.key_range().is_none());
    assert!(!empty.may_contain(KeyRef::Int(0)));
}

#[test]
fn a_key_twice_in_a_diff_is_named() {
    let err = message(Run::from_unsorted(
        diff(ints(&[3, 1, 3]), &[Some(1), None, None]),
        "k",
        DEFAULT_FPP,
    ));
    assert!(
        err.contains("invalid configuration: key column 'k' holds key 3 twice (rows 0 and 2)"),
        "{err}"
    );
    let keys: ArrayRef = Arc::new(StringArray::from(vec!["b", "a", "b"]));
    let err = message(Run::from_unsorted(
        diff(keys, &[None, None, Some(1)]),
        "k",
        0.01,
    ));
    assert!(err.contains(r#"holds key "b" twice"#), "{err}");
}

#[test]
fn a_stored_batch_out_of_order_is_a_corrupt_file() {
    let sorted = |keys: &[i64]| {
        let values = vec![Some(1); keys.len()];
        Run::from_sorted(diff(ints(keys), &values), "k", DEFAULT_FPP, "run-1.arrow")
    };
    let err = sorted(&[1, 5, 2]).unwrap_err();
    assert!(matches!(err, Error::Snapshot(_)), "{err}");
    assert!(
        err.to_string()
            .contains("run-1.arrow: keys 1 and 2 are out of order"),
        "{err}"
    );
    assert!(message(sorted(&[1, 2, 2])).contains("keys 1 and 2 are out of order or repeated"));
    let ok = sorted(&[1, 2, 7]).unwrap();
    assert_eq!(ok.len(), 3);
    let err = message(Run::from_sorted(full(ints(&[1]), &[1]), "k", 1.5, "r"));
    assert!(err.contains("false-positive probability"), "{err}");
}

/// A diff batch with its `__deleted` column replaced.
fn with_tombstones(column: ArrayRef, nullable: bool) -> RecordBatch {
    let batch = diff(ints(&[1, 2]), &[Some(1), None]);
    let mut fields = batch.schema().fields().to_vec();
    fields[3] = Arc::new(Field::new(
        DELETED_COLUMN,
        column.data_type().clone(),
        nullable,
    ));
    let mut columns = batch.columns().to_vec();
    columns[3] = column;
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

#[test]
fn tombstones_are_a_last_non_null_boolean_column() {
    let wrong_type = with_tombstones(Arc::new(Int32Array::from(vec![0, 1])), false);
    let err = message(Run::from_unsorted(wrong_type.clone(), "k", DEFAULT_FPP));
    assert!(err.contains("'__deleted' column has type Int32; tombstones are a non-null Boolean"));
    let err = Run::from_sorted(wrong_type, "k", DEFAULT_FPP, "run-2.arrow").unwrap_err();
    assert!(matches!(err, Error::Snapshot(_)), "{err}");
    assert!(err
        .to_string()
        .contains("run-2.arrow: a run's '__deleted' column has type Int32"));

    let nulls = with_tombstones(Arc::new(BooleanArray::from(vec![Some(false), None])), true);
    let err = message(Run::from_unsorted(nulls, "k", DEFAULT_FPP));
    assert!(err.contains("'__deleted' column holds 1 null(s)"), "{err}");

    let batch = diff(ints(&[1]), &[Some(1)]);
    let moved = batch.project(&[3, 0, 1, 2]).unwrap();
    let err = message(Run::from_unsorted(moved, "k", DEFAULT_FPP));
    assert!(
        err.contains("'__deleted' is column 0 of 4; it must be the last one"),
        "{err}"
    );
}

#[test]
fn the_key_column_must_be_there_typed_and_non_null() {
    let batch = full(ints(&[1]), &[1]);
    let err = message(Run::from_unsorted(batch, "key", DEFAULT_FPP));
    assert!(
        err.contains("no key column 'key' (columns: k, v, s)"),
        "{err}"
    );
    let floats: ArrayRef = Arc::new(Float64Array::from(vec![1.0]));
    let batch = RecordBatch::try_from_iter([("k", floats)]).unwrap();
    let err = message(Run::from_unsorted(batch, "k", DEFAULT_FPP));
    assert!(err.contains("key column 'k' has type Float64"), "{err}");
    let nullable: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None]));
    let batch = RecordBatch::try_from_iter([("k", nullable)]).unwrap();
    let err = message(Run::from_unsorted(batch, "k", DEFAULT_FPP));
    assert!(err.contains("holds 1 null(s)"), "{err}");
}

#[test]
fn a_run_is_rebuilt_from_its_file_and_filter() {
    let keys: Vec<i64> = (0..1000).map(|k| k * 3).collect();
    let original = run(&keys, &vec![Some(1); keys.len()]);
    let bytes = original.filter_bytes().unwrap();
    let back = Run::from_parts(original.batch().clone(), "k", &bytes, "run-4.arrow").unwrap();
    assert_eq!(back.filter(), original.filter());
    assert_eq!(back.key_range(), original.key_range());

    let err = Run::from_parts(original.batch().clone(), "k", &bytes[..31], "run-4.bloom");
    assert!(message(err).contains("run-4.bloom: a bloom filter of 31 bytes is corrupt"));
    // Another run's filter: it lacks (nearly all of) these keys.
    let other = run(&[1, 2], &[Some(1), Some(2)]).filter_bytes().unwrap();
    let err = Run::from_parts(original.batch().clone(), "k", &other, "run-4.arrow").unwrap_err();
    assert!(matches!(err, Error::Snapshot(_)));
    assert!(
        err.to_string()
            .contains("run-4.arrow: its bloom filter lacks key"),
        "{err}"
    );
    let unsorted = diff(ints(&[2, 1]), &[None, None]);
    assert!(Run::from_parts(unsorted, "k", &bytes, "r").is_err());
}

fn int_set(runs: Vec<Run>) -> RunSet {
    let mut set = RunSet::new(&schema(DataType::Int64), "k").unwrap();
    for r in runs.into_iter().rev() {
        set.push_newest(r).unwrap();
    }
    set
}

#[test]
fn the_newest_run_holding_a_key_decides() {
    let set = int_set(vec![
        run(&[1, 4], &[None, Some(40)]),
        run(&[1, 2, 4], &[Some(10), Some(20), None]),
        Run::from_unsorted(full(ints(&[1, 2, 3]), &[1, 2, 3]), "k", DEFAULT_FPP).unwrap(),
    ]);
    let probes = Int64Array::from(vec![3, 1, 4, 2, 9, 3]);
    let lookup = set.lookup(&probes).unwrap();
    let hits = [
        Some((2, 2)),
        None,
        Some((0, 1)),
        Some((1, 1)),
        None,
        Some((2, 2)),
    ];
    assert_eq!(lookup.hits(), hits);
    let (batch, found) = lookup.to_batch().unwrap();
    assert_eq!(batch.schema(), set.lookup_schema());
    assert_eq!(batch.column(0).to_data(), probes.to_data());
    assert_eq!(
        values(&batch),
        [Some(3), None, Some(40), Some(20), None, Some(3)]
    );
    let texts: Vec<_> = batch.column(2).as_string::<i32>().iter().collect();
    assert_eq!(
        texts,
        [Some("s3"), None, Some("s40"), Some("s20"), None, Some("s3")]
    );
    assert_eq!(
        found,
        BooleanArray::from(vec![true, false, true, true, false, true])
    );
    let stats = lookup.stats();
    assert_eq!((stats.probes, stats.found, stats.deleted), (6, 4, 1));
    // 9 is outside every run's range; 3, 2 and 3 again are in the newest's
    // range but not in it, and both 3s not in the next one either: each
    // pair filtered or a false positive.
    assert_eq!(
        (stats.range_pruned, stats.runs_searched),
        (3, 3),
        "{stats:?}"
    );
    assert_eq!(
        stats.filter_pruned + stats.filter_false_positives,
        5,
        "{stats:?}"
    );
}

#[test]
fn probes_outside_a_run_or_its_filter_skip_it() {
    let set = int_set(vec![
        run(&(100..200).collect::<Vec<_>>(), &[Some(1); 100]),
        run(&(0..100).collect::<Vec<_>>(), &[Some(2); 100]),
    ]);
    let probes = Int64Array::from((0..100).collect::<Vec<i64>>());
    let stats = set.lookup(&probes).unwrap().stats();
    assert_eq!(stats.range_pruned, 100, "{stats:?}");
    assert_eq!((stats.runs_searched, stats.found), (1, 100));
    // Keys inside the newest run's range but not in it: its filter drops
    // most, the rest are false positives; all are then absent.
    let set = int_set(vec![run(
        &(0..2000).map(|k| k * 2).collect::<Vec<_>>(),
        &[Some(1); 2000],
    )]);
    let odd = Int64Array::from((0..2000).map(|k| k * 2 + 1).collect::<Vec<i64>>());
    let stats = set.lookup(&odd).unwrap().stats();
    assert_eq!(stats.range_pruned, 1, "{stats:?}"); // 3999
    assert_eq!(
        stats.filter_pruned + stats.filter_false_positives,
        1999,
        "{stats:?}"
    );
    assert!(stats.filter_false_positives < 100, "{stats:?}");
    assert_eq!(stats.found, 0);
}

#[test]
fn an_empty_set_finds_nothing_with_the_tables_lookup_schema() {
    let table = crate::state::StateTable::new(
        schema(DataType::Utf8),
        "k",
        crate::state::StatePolicy::default(),
    )
    .unwrap();
    let set = RunSet::new(&table.schema(), "k").unwrap();
    assert_eq!(set.lookup_schema(), table.lookup_schema());
    let set2 = RunSet::new(&table.lookup_schema(), "k").unwrap();
    assert_eq!(set2.lookup_schema(), table.lookup_schema());
    let probes = StringArray::from(vec!["a", "a"]);
    let (batch, found) = set.lookup(&probes).unwrap().to_batch().unwrap();
    assert_eq!((batch.num_rows(), found.true_count()), (2, 0));
    assert_eq!(batch.column(1).null_count(), 2);
}

#[test]
fn probes_must_be_non_null_keys_of_the_sets_type() {
    let set = int_set(vec![run(&[1], &[Some(1)])]);
    let err = set.lookup(&Int32Array::from(vec![1])).unwrap_err();
    assert!(matches!(err, Error::Config(_)));
    assert!(err
        .to_string()
        .contains("has type Int32, the state table's key type is Int64"));
    let err = message(set.lookup(&Int64Array::from(vec![Some(1), None])));
    assert!(err.contains("holds 1 null(s)"), "{err}");
}

#[test]
fn a_set_takes_runs_of_its_columns_and_a_base_only_as_oldest() {
    let err = message(RunSet::new(&schema(DataType::Int64), "x"));
    assert!(
        err.contains("key column 'x' is not in the state schema"),
        "{err}"
    );
    let err = message(RunSet::new(diff(ints(&[1]), &[None]).schema_ref(), "k"));
    assert!(err.contains("without '__deleted'"), "{err}");

    let mut set = int_set(vec![run(&[1], &[Some(1)])]);
    let keys: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
    let strings = Run::from_unsorted(diff(keys, &[None]), "k", DEFAULT_FPP).unwrap();
    let err = message(set.push_newest(strings));
    assert!(err.contains("does not fit columns (k: Int64, v: Int64, s: Utf8) keyed by 'k'"));
    let base = Run::from_unsorted(full(ints(&[1]), &[1]), "k", DEFAULT_FPP).unwrap();
    let err = message(set.push_newest(base.clone()));
    assert!(
        err.contains("a base run (no '__deleted' column) is the whole state"),
        "{err}"
    );

    set.push_newest(run(&[2], &[None])).unwrap();
    let err = message(set.replace(0..0, run(&[1], &[None])));
    assert!(
        err.contains("cannot replace runs 0..0 of a set of 2"),
        "{err}"
    );
    assert!(set.replace(1..3, run(&[1], &[None])).is_err());
    assert!(message(set.replace(0..1, base.clone())).contains("a base run"));
    let gone = set.replace(0..2, base).unwrap();
    assert_eq!((gone.len(), set.len()), (2, 1));
    assert!(set.runs()[0].is_base());
}

#[test]
fn merges_refuse_no_runs_mixed_columns_and_a_base_before_the_end() {
    assert!(message(merge(&[], false, DEFAULT_FPP)).contains("at least one run"));
    let keys: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
    let strings = Run::from_unsorted(diff(keys, &[None]), "k", DEFAULT_FPP).unwrap();
    let ints_run = run(&[1], &[None]);
    assert!(message(merge(&[&ints_run, &strings], false, DEFAULT_FPP)).contains("does not fit"));
    let base = Run::from_unsorted(full(ints(&[1]), &[1]), "k", DEFAULT_FPP).unwrap();
    let err = message(merge(&[&base, &ints_run], false, DEFAULT_FPP));
    assert!(err.contains("run 0 of 2 is a base"), "{err}");
}

#[test]
fn a_merge_keeps_the_newest_row_and_counts_what_it_moved() {
    let newer = run(&[1, 3, 5], &[None, Some(30), Some(50)]);
    let older = run(&[1, 2, 3], &[Some(10), None, Some(3)]);
    let kept = merge(&[&newer, &older], false, DEFAULT_FPP).unwrap();
    assert_eq!(
        kept.run.keys().as_primitive::<Int64Type>().values(),
        &[1, 2, 3, 5]
    );
    assert_eq!(values(kept.run.batch()), [None, None, Some(30), Some(50)]);
    assert_eq!(kept.run.tombstone_count(), 2);
    let s = kept.stats;
    assert_eq!(
        (s.runs_in, s.rows_in, s.rows_out, s.tombstones_dropped),
        (2, 6, 4, 0)
    );
    assert_eq!(
        (s.bytes_in, s.bytes_out),
        (
            newer.size_bytes() + older.size_bytes(),
            kept.run.size_bytes()
        )
    );

    let dropped = merge(&[&newer, &older], true, DEFAULT_FPP).unwrap();
    assert!(dropped.run.is_base());
    assert_eq!(
        dropped.run.keys().as_primitive::<Int64Type>().values(),
        &[3, 5]
    );
    assert_eq!(dropped.stats.tombstones_dropped, 2);
    let all_gone = merge(&[&run(&[1], &[None])], true, DEFAULT_FPP).unwrap();
    assert!(all_gone.run.is_empty() && all_gone.run.is_base());
}

/// Long stretches of one run between another's keys (a base under a few
/// changes) are taken a range at a time: the rows, the newest winning at
/// the stretches' ends, are a row-by-row reference merge's, whole and read
/// in chunks that end inside stretches.
#[test]
fn a_merge_takes_long_stretches_whole_and_settles_their_ends() {
    use super::{merge_rows, MergeCursor, RunChunks};
    use std::collections::BTreeMap;

    let base_keys: Vec<i64> = (0..5_000).map(|k| k * 2).collect();
    let base_values: Vec<i64> = base_keys.iter().map(|k| k + 1).collect();
    let base = Run::from_unsorted(full(ints(&base_keys), &base_values), "k", DEFAULT_FPP).unwrap();
    // Ties with the base at a stretch's first and last rows, keys between
    // the base's, before and after all of them, tombstones among them.
    let older = run(
        &[-5, 0, 1, 2_001, 4_000, 9_998, 20_000],
        &[Some(-50), Some(0), None, Some(2), None, Some(9), Some(7)],
    );
    let newer = run(&[0, 4_000, 4_002, 9_999], &[None, Some(4), None, Some(99)]);
    let runs = [&newer, &older, &base];
    for drop_tombstones in [false, true] {
        let mut want: BTreeMap<i64, Option<i64>> = BTreeMap::new();
        for (k, v) in base_keys.iter().zip(&base_values) {
            want.insert(*k, Some(*v));
        }
        for r in [&older, &newer] {
            let keys = r.keys().as_primitive::<Int64Type>().values().to_vec();
            for (k, v) in keys.iter().zip(values(r.batch())) {
                want.insert(*k, v);
            }
        }
        if drop_tombstones {
            want.retain(|_, v| v.is_some());
        }
        let whole = merge_rows(&runs, drop_tombstones).unwrap();
        let got_keys = whole
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(got_keys, want.keys().copied().collect::<Vec<_>>());
        assert_eq!(values(&whole), want.values().copied().collect::<Vec<_>>());
        let texts: Vec<Option<String>> = whole
            .column(2)
            .as_string::<i32>()
            .iter()
            .map(|s| s.map(str::to_string))
            .collect();
        let want_texts: Vec<Option<String>> = want.values().map(|v| v.map(text)).collect();
        assert_eq!(texts, want_texts);
        if !drop_tombstones {
            let deleted = whole.column(3).as_boolean();
            let want_deleted: Vec<bool> = want.values().map(Option::is_none).collect();
            assert_eq!(
                deleted.iter().map(Option::unwrap).collect::<Vec<_>>(),
                want_deleted
            );
        }
        for max in [1, 7, 1_000, 4_999] {
            let mut cursor = MergeCursor::new(&runs, drop_tombstones).unwrap();
            let mut chunks = Vec::new();
            while let Some(chunk) = cursor.next_chunk(max).unwrap() {
                chunks.push(chunk);
            }
            let last = chunks.len() - 1;
            assert!(
                chunks.iter().take(last).all(|c| c.num_rows() == max),
                "max {max}"
            );
            let streamed = arrow_select::concat::concat_batches(cursor.schema(), &chunks).unwrap();
            assert_eq!(streamed, whole, "max {max}");
        }
    }
}

#[test]
fn int32_and_binary_keys_look_up_and_merge() {
    let cases: [(ArrayRef, ArrayRef, ArrayRef); 2] = [
        (
            Arc::new(Int32Array::from(vec![7, -1])),
            Arc::new(Int32Array::from(vec![-1, 3])),
            Arc::new(Int32Array::from(vec![3, 7, -1, 0])),
        ),
        (
            Arc::new(BinaryArray::from_iter_values([&b"\xff"[..], b""])),
            Arc::new(BinaryArray::from_iter_values([&b""[..], b"q"])),
            Arc::new(BinaryArray::from_iter_values([
                &b"q"[..],
                b"\xff",
                b"",
                b"z",
            ])),
        ),
    ];
    for (newer, older, probes) in cases {
        let mut set = RunSet::new(&schema(newer.data_type().clone()), "k").unwrap();
        set.push_newest(Run::from_unsorted(diff(older, &[Some(1), Some(3)]), "k", 0.01).unwrap())
            .unwrap();
        set.push_newest(Run::from_unsorted(diff(newer, &[Some(7), None]), "k", 0.01).unwrap())
            .unwrap();
        let want = [Some(3), Some(7), None, None];
        let (batch, _) = set.lookup(probes.as_ref()).unwrap().to_batch().unwrap();
        assert_eq!(values(&batch), want);
        let runs: Vec<&Run> = set.runs().iter().map(|r| r.as_ref()).collect();
        let merged = merge(&runs, true, DEFAULT_FPP).unwrap().run;
        set.replace(0..2, merged).unwrap();
        let (batch, _) = set.lookup(probes.as_ref()).unwrap().to_batch().unwrap();
        assert_eq!(values(&batch), want);
    }
}
