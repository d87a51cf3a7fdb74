//! Run sets against a model: random batches of upserts and deletes become
//! runs (the first possibly a base), and lookups of random probes (absent
//! keys and duplicates included) must agree with a `BTreeMap` that applied
//! the same batches, before and after random compactions: a merge of any
//! contiguous newest-first range put back with `replace`, dropping
//! tombstones only when the range ends with the oldest run. A second model
//! is `StateTable` itself: its checkpoints as runs answer its lookups.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, Int64Array, StringArray};
use arrow_schema::DataType;
use arrow_select::concat::concat_batches;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::tests::{diff, full, schema, text};
use super::{merge, MergeCursor, Run, RunChunks, RunSet, DEFAULT_FPP};
use crate::state::{StatePolicy, StateTable};

trait TestKey: Ord + Clone + Debug {
    fn data_type() -> DataType;
    fn array(keys: &[Self]) -> ArrayRef;
}

impl TestKey for i64 {
    fn data_type() -> DataType {
        DataType::Int64
    }
    fn array(keys: &[Self]) -> ArrayRef {
        Arc::new(Int64Array::from(keys.to_vec()))
    }
}

impl TestKey for String {
    fn data_type() -> DataType {
        DataType::Utf8
    }
    fn array(keys: &[Self]) -> ArrayRef {
        Arc::new(StringArray::from_iter_values(keys))
    }
}

/// A batch of changes: each key once, in random order; `None` deletes.
type Changes<K> = Vec<(K, Option<i64>)>;

fn changes<K: TestKey>(key: impl Strategy<Value = K>) -> impl Strategy<Value = Changes<K>> {
    prop::collection::btree_map(key, prop::option::of(-50i64..50), 0..12)
        .prop_map(|m| m.into_iter().collect::<Vec<_>>())
        .prop_shuffle()
}

/// The set of `batches` (oldest first; the first a base if `base_first`)
/// and the model state they leave.
fn build<K: TestKey>(batches: &[Changes<K>], base_first: bool) -> (RunSet, BTreeMap<K, i64>) {
    let mut set = RunSet::new(&schema(K::data_type()), "k").unwrap();
    let mut model = BTreeMap::new();
    for (i, changes) in batches.iter().enumerate() {
        let batch = if i == 0 && base_first {
            let live: Vec<(K, i64)> = changes
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), (*v)?)))
                .collect();
            let keys: Vec<K> = live.iter().map(|(k, _)| k.clone()).collect();
            let values: Vec<i64> = live.iter().map(|(_, v)| *v).collect();
            model.extend(live);
            full(K::array(&keys), &values)
        } else {
            let keys: Vec<K> = changes.iter().map(|(k, _)| k.clone()).collect();
            let values: Vec<Option<i64>> = changes.iter().map(|(_, v)| *v).collect();
            for (k, v) in changes {
                match v {
                    Some(v) => model.insert(k.clone(), *v),
                    None => model.remove(k),
                };
            }
            diff(K::array(&keys), &values)
        };
        // A loose filter, so that false positives happen.
        set.push_newest(Run::from_unsorted(batch, "k", 0.2).unwrap())
            .unwrap();
    }
    (set, model)
}

fn check_lookups<K: TestKey>(
    set: &RunSet,
    model: &BTreeMap<K, i64>,
    probes: &[K],
) -> Result<(), TestCaseError> {
    let array = K::array(probes);
    let lookup = set.lookup(array.as_ref()).unwrap();
    let (batch, found) = lookup.to_batch().unwrap();
    prop_assert_eq!(batch.schema(), set.lookup_schema());
    prop_assert_eq!(batch.column(0).to_data(), array.to_data());
    let (v, s) = (
        batch.column(1).as_primitive::<Int64Type>(),
        batch.column(2).as_string::<i32>(),
    );
    for (i, key) in probes.iter().enumerate() {
        let want = model.get(key).copied();
        prop_assert_eq!(found.value(i), want.is_some(), "probe {:?}", key);
        prop_assert_eq!(v.is_valid(i).then(|| v.value(i)), want, "probe {:?}", key);
        prop_assert_eq!(
            s.is_valid(i).then(|| s.value(i).to_string()),
            want.map(text)
        );
    }
    let stats = lookup.stats();
    prop_assert_eq!(stats.probes, probes.len());
    prop_assert_eq!(stats.found, found.true_count());
    prop_assert!(stats.runs_searched <= set.len());
    // In chunks of key order (pages released between them): the same rows
    // in the order asked, each chunk followed by its call.
    for chunks in [1, 2, 3, 7] {
        let mut calls = 0;
        let (chunked, chunk_found, chunk_stats) = set
            .gather_in_key_chunks(array.as_ref(), chunks, &mut || calls += 1)
            .unwrap();
        prop_assert_eq!(&chunked, &batch, "{} chunks", chunks);
        prop_assert_eq!(&chunk_found, &found);
        prop_assert_eq!(chunk_stats.probes, stats.probes);
        prop_assert_eq!(chunk_stats.found, stats.found);
        prop_assert_eq!(chunk_stats.deleted, stats.deleted);
        let want_calls = if chunks <= 1 || probes.len() < 2 {
            1
        } else {
            probes.len().div_ceil(probes.len().div_ceil(chunks))
        };
        prop_assert_eq!(calls, want_calls);
        let mut counted = 0;
        let only = set
            .stats_in_key_chunks(array.as_ref(), chunks, &mut || counted += 1)
            .unwrap();
        prop_assert_eq!(only, chunk_stats, "{} chunks", chunks);
        prop_assert_eq!(counted, want_calls);
    }
    Ok(())
}

/// Applies each merge (a range picked by two numbers, and whether to drop
/// tombstones if the range ends with the oldest run), checking lookups after each.
fn compact<K: TestKey>(
    mut set: RunSet,
    model: &BTreeMap<K, i64>,
    probes: &[K],
    merges: &[(usize, usize, bool)],
) -> Result<(), TestCaseError> {
    for &(a, b, drop_if_oldest) in merges {
        let n = set.len();
        let start = a % n;
        let end = start + 1 + b % (n - start);
        let drop_tombstones = drop_if_oldest && end == n;
        let runs: Vec<&Run> = set.runs()[start..end].iter().map(|r| r.as_ref()).collect();
        let merged = merge(&runs, drop_tombstones, DEFAULT_FPP).unwrap();
        let rechecked = Run::from_sorted(merged.run.batch().clone(), "k", DEFAULT_FPP, "merged");
        prop_assert!(rechecked.is_ok(), "{:?}", rechecked.err());
        prop_assert_eq!(merged.run.is_base(), drop_tombstones);
        prop_assert!(
            merged.stats.rows_out + merged.stats.tombstones_dropped <= merged.stats.rows_in
        );
        set.replace(start..end, merged.run).unwrap();
        prop_assert_eq!(set.len(), n - (end - start) + 1);
        check_lookups(&set, model, probes)?;
    }
    Ok(())
}

fn check_model<K: TestKey>(
    batches: Vec<Changes<K>>,
    base_first: bool,
    mut probes: Vec<K>,
    merges: Vec<(usize, usize, bool)>,
) -> Result<(), TestCaseError> {
    let (set, model) = build(&batches, base_first);
    // Every key ever written or deleted, besides the random ones.
    probes.extend(batches.iter().flatten().map(|(k, _)| k.clone()));
    check_lookups(&set, &model, &probes)?;
    compact(set, &model, &probes, &merges)
}

fn merges() -> impl Strategy<Value = Vec<(usize, usize, bool)>> {
    prop::collection::vec((0usize..64, 0usize..64, any::<bool>()), 0..4)
}

/// A table's changes: `Some(v)` upserts, `None` deletes; checkpoint after each batch.
fn table_model(batches: &[Changes<i64>], probes: &[i64]) -> Result<(), TestCaseError> {
    let mut table =
        StateTable::new(schema(DataType::Int64), "k", StatePolicy { full_every: 4 }).unwrap();
    let mut set = RunSet::new(&table.schema(), "k").unwrap();
    for (id, changes) in batches.iter().enumerate() {
        let ups: Vec<(i64, i64)> = changes
            .iter()
            .filter_map(|(k, v)| Some((*k, (*v)?)))
            .collect();
        let keys: Vec<i64> = ups.iter().map(|u| u.0).collect();
        let values: Vec<i64> = ups.iter().map(|u| u.1).collect();
        table.upsert(&full(i64::array(&keys), &values)).unwrap();
        let dead: Vec<i64> = changes
            .iter()
            .filter(|c| c.1.is_none())
            .map(|c| c.0)
            .collect();
        table.delete(&Int64Array::from(dead)).unwrap();
        let capture = table.checkpoint(id as u64 + 1).unwrap();
        let run = Run::from_unsorted(capture.batch, "k", DEFAULT_FPP).unwrap();
        if run.is_base() {
            set = RunSet::new(&table.schema(), "k").unwrap();
        }
        set.push_newest(run).unwrap();
    }
    let probes = Int64Array::from(probes.to_vec());
    let want = table.lookup(&probes).unwrap();
    prop_assert_eq!(
        set.lookup(&probes).unwrap().to_batch().unwrap(),
        want.clone()
    );
    let runs: Vec<&Run> = set.runs().iter().map(|r| r.as_ref()).collect();
    let all = merge(&runs, true, DEFAULT_FPP).unwrap().run;
    // Read a chunk at a time, the merge gives the same rows, tombstones
    // kept or dropped.
    for drop_tombstones in [true, false] {
        let whole = merge(&runs, drop_tombstones, DEFAULT_FPP).unwrap();
        let mut cursor = MergeCursor::new(&runs, drop_tombstones).unwrap();
        let mut chunks = Vec::new();
        while let Some(chunk) = cursor.next_chunk(1 + probes.len() % 5).unwrap() {
            prop_assert!(chunk.num_rows() <= 1 + probes.len() % 5);
            chunks.push(chunk);
        }
        let streamed = concat_batches(cursor.schema(), &chunks).unwrap();
        prop_assert_eq!(&streamed, whole.run.batch());
        prop_assert_eq!(cursor.tombstones_dropped(), whole.stats.tombstones_dropped);
    }
    let table_rows = table.to_batch();
    prop_assert_eq!(all.len(), table_rows.num_rows());
    set.replace(0..set.len(), all).unwrap();
    prop_assert_eq!(set.lookup(&probes).unwrap().to_batch().unwrap(), want);
    Ok(())
}

proptest! {
    #[test]
    fn int_keys_agree_with_the_model(
        batches in prop::collection::vec(changes(-20i64..20), 1..8),
        base_first in any::<bool>(),
        probes in prop::collection::vec(-25i64..25, 0..40),
        merges in merges(),
    ) {
        check_model(batches, base_first, probes, merges)?;
    }

    #[test]
    fn string_keys_agree_with_the_model(
        batches in prop::collection::vec(changes("[a-d]{0,2}"), 1..8),
        base_first in any::<bool>(),
        probes in prop::collection::vec("[a-e]{0,2}", 0..40),
        merges in merges(),
    ) {
        check_model(batches, base_first, probes, merges)?;
    }

    #[test]
    fn a_tables_checkpoints_as_runs_answer_its_lookups(
        batches in prop::collection::vec(changes(-20i64..20), 1..10),
        probes in prop::collection::vec(-25i64..25, 0..40),
    ) {
        table_model(&batches, &probes)?;
    }
}
