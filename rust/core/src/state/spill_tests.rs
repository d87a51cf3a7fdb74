//! A `StateTable` with a memory budget against a model map: random
//! upserts, deletes, flushes, lookups, checkpoints and restores; the
//! table's reads, its length and every checkpoint (restored into a plain
//! table) must agree with a `BTreeMap` that applied the same operations.
//! Then the budget itself: flushes keep the memtable near it, the runs go
//! to local files, and bad budgets are refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::{parse_memory, InMemoryRuns, StatePolicy, StateTable, MAX_RUNS, MIN_STATE_MEMORY};
use crate::protocol::CheckpointId;
use crate::snapshot::{StateCapture, StateKind};
use crate::store::LocalRuns;

pub(super) fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
        Field::new("s", DataType::Utf8, true),
    ]))
}

pub(super) fn rows(pairs: &[(i64, i64)]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(pairs.iter().map(|p| p.0))),
            Arc::new(Int64Array::from_iter_values(pairs.iter().map(|p| p.1))),
            Arc::new(StringArray::from_iter(
                pairs
                    .iter()
                    .map(|p| (p.1 % 3 != 0).then(|| format!("s{}", p.1))),
            )),
        ],
    )
    .unwrap()
}

pub(super) fn as_map(batch: &RecordBatch) -> BTreeMap<i64, i64> {
    let k = batch.column(0).as_primitive::<Int64Type>();
    let v = batch.column(1).as_primitive::<Int64Type>();
    (0..batch.num_rows())
        .map(|i| (k.value(i), v.value(i)))
        .collect()
}

fn spilling(policy: StatePolicy) -> StateTable {
    StateTable::new(schema(), "k", policy)
        .unwrap()
        .with_memory_budget(MIN_STATE_MEMORY, Box::new(InMemoryRuns))
        .unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Upsert(Vec<(i64, i64)>),
    Delete(Vec<i64>),
    Flush,
    Lookup(Vec<i64>),
    Checkpoint,
    Abort,
    /// `true`: as a mapped chain (`restore_mapped`), the full adopted as it is
    /// where sorted.
    Restore(bool),
}

fn op() -> impl Strategy<Value = Op> {
    let key = -30i64..30;
    prop_oneof![
        4 => prop::collection::vec((key.clone(), -100i64..100), 0..12).prop_map(Op::Upsert),
        2 => prop::collection::vec(key.clone(), 0..8).prop_map(Op::Delete),
        2 => Just(Op::Flush),
        2 => prop::collection::vec(key, 0..12).prop_map(Op::Lookup),
        2 => Just(Op::Checkpoint),
        1 => Just(Op::Abort),
        1 => any::<bool>().prop_map(Op::Restore),
    ]
}

/// Checkpoints taken and stored, oldest first, as a restore reads them:
/// the chain from the newest full on.
#[derive(Default)]
struct Stored {
    chain: Vec<(CheckpointId, StateCapture)>,
    model: BTreeMap<i64, i64>,
}

/// The keys of `model` whose value (the time index's column here) is at
/// most `t`, by value then key: what `due(t)` must return.
fn due_in(model: &BTreeMap<i64, i64>, t: i64) -> Vec<i64> {
    let mut due: Vec<(i64, i64)> = model
        .iter()
        .filter(|(_, v)| **v <= t)
        .map(|(k, v)| (*v, *k))
        .collect();
    due.sort();
    due.into_iter().map(|(_, k)| k).collect()
}

fn due_of(t: &mut StateTable, threshold: i64) -> Vec<i64> {
    let keys = t.due(threshold).unwrap();
    keys.as_primitive::<Int64Type>().values().to_vec()
}

/// The chain with every capture's rows sorted by key, as the Spark state
/// files are written (and as a mapped restore takes them as runs).
fn sorted_chain(chain: &[(CheckpointId, StateCapture)]) -> Vec<(CheckpointId, StateCapture)> {
    chain
        .iter()
        .map(|(id, c)| {
            let keys = c.batch.column(0).as_primitive::<Int64Type>();
            let mut order: Vec<u32> = (0..keys.len() as u32).collect();
            order.sort_by_key(|&i| keys.value(i as usize));
            let batch = arrow_select::take::take_record_batch(
                &c.batch,
                &arrow_array::UInt32Array::from(order),
            )
            .unwrap();
            (
                *id,
                StateCapture {
                    kind: c.kind,
                    batch,
                    filter: None,
                    times: None,
                },
            )
        })
        .collect()
}

/// Without a budget (`budget` false) the table spills only once a mapped
/// restore opened it lazily, and never flushes (`Op::Flush` is skipped).
fn check(
    ops: Vec<Op>,
    policy: StatePolicy,
    time_index: bool,
    budget: bool,
) -> Result<(), TestCaseError> {
    // Indexed by its value column as by a time: flushes, restores and
    // deletes from runs must keep the index whole. Without the index a
    // mapped restore takes the diffs as runs too.
    let mut t = if budget {
        spilling(policy)
    } else {
        StateTable::new(schema(), "k", policy).unwrap()
    };
    if time_index {
        // A few entries in memory: the index's runs, merges and stale
        // entries come into nearly every case.
        t = t.with_time_index("v").unwrap().with_time_memory_entries(3);
    }
    let mut model: BTreeMap<i64, i64> = BTreeMap::new();
    let mut stored = Stored::default();
    let mut next: CheckpointId = 1;
    for op in ops {
        match op {
            Op::Upsert(pairs) => {
                // Within a batch the last row of a key wins.
                t.upsert(&rows(&pairs)).unwrap();
                for (k, v) in pairs {
                    model.insert(k, v);
                }
            }
            Op::Delete(keys) => {
                let mut expected = 0;
                let mut gone = std::collections::BTreeSet::new();
                for k in &keys {
                    if gone.insert(*k) && model.remove(k).is_some() {
                        expected += 1;
                    }
                }
                let removed = t.delete(&Int64Array::from(keys)).unwrap();
                prop_assert_eq!(removed, expected);
            }
            Op::Flush if !budget => {
                prop_assert!(t.flush().is_err(), "a table without a budget never flushes");
            }
            Op::Flush => t.flush().unwrap(),
            Op::Lookup(keys) => {
                let (found, present) = t.lookup(&Int64Array::from(keys.clone())).unwrap();
                prop_assert_eq!(found.schema(), t.lookup_schema());
                let v = found.column(1).as_primitive::<Int64Type>();
                for (i, k) in keys.iter().enumerate() {
                    prop_assert_eq!(present.value(i), model.contains_key(k), "key {}", k);
                    let got = (!v.is_null(i)).then(|| v.value(i));
                    prop_assert_eq!(got, model.get(k).copied(), "key {}", k);
                }
                let got = t.get(&Int64Array::from(keys.clone())).unwrap();
                let want: Vec<i64> = keys
                    .iter()
                    .filter(|k| model.contains_key(k))
                    .copied()
                    .collect();
                let got_keys: Vec<i64> =
                    got.column(0).as_primitive::<Int64Type>().values().to_vec();
                prop_assert_eq!(got_keys, want);
            }
            Op::Checkpoint => {
                let capture = t.checkpoint(next).unwrap();
                match capture.kind {
                    StateKind::Full => stored.chain.clear(),
                    StateKind::Diff { base } => {
                        prop_assert_eq!(Some(base), stored.chain.last().map(|c| c.0))
                    }
                }
                stored.chain.push((next, capture));
                stored.model = model.clone();
                next += 1;
                // The stored chain restores into a plain table as the model.
                let mut plain = StateTable::new(schema(), "k", policy)
                    .unwrap()
                    .with_time_index("v")
                    .unwrap();
                plain.restore(&stored.chain).unwrap();
                prop_assert_eq!(as_map(&plain.to_batch()), stored.model.clone());
                prop_assert_eq!(due_of(&mut plain, 0), due_in(&stored.model, 0));
            }
            Op::Abort => {
                // A checkpoint taken and never stored: the next must be full.
                t.checkpoint(next).unwrap();
                t.checkpoint_aborted();
                next += 1;
            }
            Op::Restore(mapped) => {
                if stored.chain.is_empty() {
                    continue;
                }
                if mapped {
                    t.restore_mapped(&sorted_chain(&stored.chain)).unwrap();
                } else {
                    t.restore(&stored.chain).unwrap();
                }
                if !budget {
                    // In memory after a plain restore; a mapped one opens it
                    // lazily (until its memtable holds every live key).
                    prop_assert!(mapped || t.spill_stats().is_none());
                    prop_assert_eq!(t.memory_budget(), None);
                }
                model = stored.model.clone();
            }
        }
        prop_assert_eq!(t.len(), model.len());
        prop_assert_eq!(as_map(&t.to_batch()), model.clone());
        if time_index {
            prop_assert_eq!(t.earliest_time().unwrap(), model.values().min().copied());
            for threshold in [-101, -50, 0, 99] {
                prop_assert_eq!(due_of(&mut t, threshold), due_in(&model, threshold));
            }
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn a_spilling_table_agrees_with_the_model(
        ops in prop::collection::vec(op(), 1..60),
        full_every in 1u32..6,
    ) {
        check(ops, StatePolicy { full_every }, true, true)?;
    }

    #[test]
    fn a_spilling_table_without_a_time_index_agrees_with_the_model(
        ops in prop::collection::vec(op(), 1..60),
        full_every in 1u32..6,
    ) {
        check(ops, StatePolicy { full_every }, false, true)?;
    }

    #[test]
    fn a_table_without_a_budget_opened_lazily_agrees_with_the_model(
        ops in prop::collection::vec(op(), 1..60),
        full_every in 1u32..6,
        time_index in any::<bool>(),
    ) {
        check(ops, StatePolicy { full_every }, time_index, false)?;
    }
}

#[test]
fn the_budget_flushes_the_memtable_and_runs_merge_past_the_limit() {
    let mut t = spilling(StatePolicy {
        full_every: u32::MAX,
    });
    let mut model = BTreeMap::new();
    // 400k distinct keys in batches of 10k: far more than 1 MiB holds.
    for b in 0..40i64 {
        let pairs: Vec<(i64, i64)> = (0..10_000).map(|i| (b * 10_000 + i, b)).collect();
        t.upsert(&rows(&pairs)).unwrap();
        model.extend(pairs);
        let stats = t.spill_stats().unwrap();
        assert!(
            stats.memtable_bytes <= MIN_STATE_MEMORY,
            "after batch {b}: {stats:?}"
        );
        assert!(stats.runs <= MAX_RUNS, "{stats:?}");
    }
    let stats = t.spill_stats().unwrap();
    assert!(stats.flushes >= 10 && stats.merges >= 1, "{stats:?}");
    assert_eq!(t.len(), model.len());
    // Rewrites of old keys find them in the runs, and the count holds.
    t.upsert(&rows(&[(5, -1), (123_456, -2), (999_999, -3)]))
        .unwrap();
    assert_eq!(t.len(), model.len() + 1);
    assert!(t.spill_stats().unwrap().run_hits >= 2);
    model.insert(5, -1);
    model.insert(123_456, -2);
    model.insert(999_999, -3);
    assert_eq!(as_map(&t.to_batch()), model);
}

#[test]
fn a_write_that_would_grow_the_memtable_past_the_budget_flushes_it_first() {
    // Fixed-width columns: the memtable's bytes are its vectors' and its
    // index's room, which double as they grow. Flushed only after such a
    // write, the memtable would have doubled past the budget (and briefly
    // held the old room beside the new) before emptying: none of the
    // write's rows would stay in it.
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let mut t = StateTable::new(schema.clone(), "k", StatePolicy { full_every: 10 })
        .unwrap()
        .with_memory_budget(MIN_STATE_MEMORY, Box::new(InMemoryRuns))
        .unwrap();
    let mut flushes = 0;
    for b in 0..100i64 {
        let keys = Int64Array::from_iter_values(b * 1_000..(b + 1) * 1_000);
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(keys.clone()), Arc::new(keys)])
                .unwrap();
        t.upsert(&batch).unwrap();
        let stats = t.spill_stats().unwrap();
        assert!(
            stats.memtable_bytes <= MIN_STATE_MEMORY,
            "after batch {b}: {stats:?}"
        );
        if stats.flushes > flushes {
            assert!(
                stats.memtable_bytes > 0,
                "batch {b} flushed the memtable after its write, not before: {stats:?}"
            );
            flushes = stats.flushes;
        }
    }
    assert!(flushes >= 3, "{flushes} flushes");
    assert_eq!(t.len(), 100_000);
}

#[test]
fn past_the_run_limit_small_runs_merge_above_a_large_base_and_large_ones_into_it() {
    // A base of 100k keys (a restore), then small flushes: the runs above
    // the base merge into one diff run and the base stays; once the runs
    // above hold a quarter of its rows, everything merges into a new base.
    let base: Vec<(i64, i64)> = (0..100_000).map(|k| (k, 0)).collect();
    let mut t = spilling(StatePolicy {
        full_every: u32::MAX,
    });
    t.restore_mapped(&[(1, plain_full_of(&base))]).unwrap();
    let mut model: BTreeMap<i64, i64> = base.into_iter().collect();
    let mut merges_above = 0;
    for b in 1..=40i64 {
        let pairs: Vec<(i64, i64)> = (0..1_000)
            .map(|i| ((b * 7_919 + i * 13) % 150_000, b))
            .collect();
        t.upsert(&rows(&pairs)).unwrap();
        t.delete(&Int64Array::from(vec![b * 11])).unwrap();
        model.extend(pairs);
        model.remove(&(b * 11));
        let before = t.spill_stats().unwrap();
        t.flush().unwrap();
        let after = t.spill_stats().unwrap();
        if after.merges > before.merges {
            // Merged above the base: two runs left (the base and the merge).
            assert!(after.runs <= 2, "{after:?}");
            merges_above += usize::from(after.runs == 2);
        }
        assert!(after.runs <= MAX_RUNS, "{after:?}");
        assert_eq!(t.len(), model.len(), "after flush {b}");
    }
    let stats = t.spill_stats().unwrap();
    assert!(merges_above >= 2, "{stats:?}");
    assert!(
        stats.merges > merges_above as u64,
        "a merge into a new base too: {stats:?}"
    );
    assert_eq!(as_map(&t.to_batch()), model);
    let probes = Int64Array::from_iter_values((0..160_000).step_by(97));
    let (_, present) = t.lookup(&probes).unwrap();
    for (i, k) in probes.values().iter().enumerate() {
        assert_eq!(present.value(i), model.contains_key(k), "key {k}");
    }
}

#[test]
fn a_checkpoint_after_flushes_holds_only_the_changes() {
    let mut t = spilling(StatePolicy {
        full_every: u32::MAX,
    });
    let all: Vec<(i64, i64)> = (0..1000).map(|k| (k, 0)).collect();
    t.upsert(&rows(&all)).unwrap();
    let first = t.checkpoint(1).unwrap();
    assert_eq!(
        (first.kind, first.batch.num_rows()),
        (StateKind::Full, 1000)
    );
    t.upsert(&rows(&[(1, 1), (2, 2)])).unwrap();
    t.flush().unwrap();
    t.upsert(&rows(&[(3, 3)])).unwrap();
    t.delete(&Int64Array::from(vec![4])).unwrap();
    t.flush().unwrap();
    t.upsert(&rows(&[(1, 11)])).unwrap();
    let diff = t.checkpoint(2).unwrap();
    assert_eq!(diff.kind, StateKind::Diff { base: 1 });
    let keys: Vec<i64> = diff
        .batch
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(keys, vec![1, 2, 3, 4], "sorted: the flushed changes merged");
    let deleted = diff.batch.column(3).as_boolean();
    assert_eq!(
        deleted.iter().collect::<Vec<_>>(),
        vec![Some(false), Some(false), Some(false), Some(true)]
    );
    assert_eq!(
        diff.batch.column(1).as_primitive::<Int64Type>().value(0),
        11
    );
    // And the next checkpoint starts afresh.
    t.upsert(&rows(&[(7, 7)])).unwrap();
    assert_eq!(t.checkpoint(3).unwrap().batch.num_rows(), 1);
}

#[test]
fn a_spilled_table_leaves_diffs_of_most_keys_to_the_compactor() {
    // 10,000 keys; an interval rewrites 6,000 of them. In memory that is a
    // full (`full_beats_diff`); a table whose runs hold state keeps it a
    // diff, streamed or not: its full would merge every run, which measured
    // slower and larger than the diffs and the compactor's merges
    // (bench/results/state_store/amplification/, under a budget).
    let fill = |t: &mut StateTable| {
        t.upsert(&rows(&(0..10_000).map(|k| (k, 0)).collect::<Vec<_>>()))
            .unwrap();
    };
    let rewrite = |t: &mut StateTable, v: i64| {
        t.upsert(&rows(&(0..6_000).map(|k| (k, v)).collect::<Vec<_>>()))
            .unwrap();
    };
    let mut memory = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    fill(&mut memory);
    memory.checkpoint(1).unwrap();
    rewrite(&mut memory, 1);
    assert_eq!(memory.checkpoint(2).unwrap().kind, StateKind::Full);
    for streamed in [true, false] {
        let mut t = spilling(StatePolicy::default());
        fill(&mut t);
        t.flush().unwrap();
        let kind = |t: &mut StateTable, id: CheckpointId| {
            if streamed {
                t.checkpoint_streamed(id).unwrap().kind
            } else {
                t.checkpoint(id).unwrap().kind
            }
        };
        assert_eq!(kind(&mut t, 1), StateKind::Full);
        rewrite(&mut t, 1);
        t.flush().unwrap();
        assert_eq!(
            kind(&mut t, 2),
            StateKind::Diff { base: 1 },
            "streamed {streamed}"
        );
        assert_eq!(as_map(&t.to_batch()), as_map(&memory.to_batch()));
    }
}

#[test]
fn a_mapped_restore_takes_each_diffs_live_keys_from_its_metadata() {
    use super::LIVE_KEYS_METADATA;
    // A full of 20k keys, then diffs that add, rewrite and delete keys.
    let mut plain = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    plain
        .upsert(&rows(&(0..20_000).map(|k| (2 * k, k)).collect::<Vec<_>>()))
        .unwrap();
    let mut chain = vec![(1, plain.checkpoint(1).unwrap())];
    for id in 2..=4u64 {
        let n = id as i64;
        let pairs: Vec<(i64, i64)> = (0..3_000).map(|i| (i * 7 * n + n, i)).collect();
        plain.upsert(&rows(&pairs)).unwrap();
        plain
            .delete(&Int64Array::from_iter_values((0..500).map(|i| i * 6 * n)))
            .unwrap();
        let diff = plain.checkpoint(id).unwrap();
        assert_eq!(diff.kind, StateKind::Diff { base: id - 1 });
        // Each diff names the keys its table held when it was captured.
        let stored = diff
            .batch
            .schema()
            .metadata()
            .get(LIVE_KEYS_METADATA)
            .cloned();
        assert_eq!(stored, Some(plain.len().to_string()), "checkpoint {id}");
        chain.push((id, diff));
    }
    let chain = sorted_chain(&chain);
    let restore = |chain: &[(CheckpointId, StateCapture)]| {
        let mut t = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
        t.restore_mapped(chain).map(|()| t)
    };
    // With the counts no key is looked up; without them (an older file)
    // each diff's keys are, once. The same keys either way.
    let t = restore(&chain).unwrap();
    let stats = t.spill_stats().unwrap();
    assert_eq!((stats.diffs_mapped, stats.run_probes), (3, 0), "{stats:?}");
    assert_eq!(t.len(), plain.len());
    assert_eq!(as_map(&t.to_batch()), as_map(&plain.to_batch()));
    // `capture` with its count set to `live`, or without one.
    let counted = |capture: &StateCapture, live: Option<&str>| {
        let mut metadata = capture.batch.schema().metadata().clone();
        match live {
            Some(n) => metadata.insert(LIVE_KEYS_METADATA.into(), n.into()),
            None => metadata.remove(LIVE_KEYS_METADATA),
        };
        let schema = Arc::new(
            capture
                .batch
                .schema()
                .as_ref()
                .clone()
                .with_metadata(metadata),
        );
        StateCapture {
            batch: RecordBatch::try_new(schema, capture.batch.columns().to_vec()).unwrap(),
            ..capture.clone()
        }
    };
    let older: Vec<_> = (chain.iter())
        .map(|(id, c)| (*id, counted(c, None)))
        .collect();
    let t = restore(&older).unwrap();
    let stats = t.spill_stats().unwrap();
    assert_eq!(stats.diffs_mapped, 3, "{stats:?}");
    let diff_rows: usize = chain[1..].iter().map(|(_, c)| c.batch.num_rows()).sum();
    assert_eq!(stats.run_probes, diff_rows as u64, "{stats:?}");
    assert_eq!(t.len(), plain.len());
    // A count the diff cannot leave, or no number, is refused naming it.
    for bad in ["1", "99999999", "many"] {
        let mut wrong = chain.clone();
        let (id, last) = wrong.pop().unwrap();
        wrong.push((id, counted(&last, Some(bad))));
        let err = restore(&wrong)
            .err()
            .unwrap_or_else(|| panic!("{bad:?} restored"))
            .to_string();
        assert!(
            err.contains(LIVE_KEYS_METADATA) && err.contains("another checkpoint"),
            "{err}"
        );
    }
}

#[test]
fn runs_spilled_to_local_files_are_mapped_back_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let runs = LocalRuns::new(dir.path()).unwrap();
    let spill_dir = runs.dir().to_path_buf();
    let mut t = StateTable::new(schema(), "k", StatePolicy::default())
        .unwrap()
        .with_memory_budget(MIN_STATE_MEMORY, Box::new(runs))
        .unwrap();
    let mut model = BTreeMap::new();
    for b in 0..(MAX_RUNS as i64 + 3) {
        let pairs: Vec<(i64, i64)> = (0..500).map(|i| (b * 300 + i, b)).collect();
        t.upsert(&rows(&pairs)).unwrap();
        model.extend(pairs);
        t.flush().unwrap();
        let files = std::fs::read_dir(&spill_dir).unwrap().count();
        assert!(
            (1..=MAX_RUNS).contains(&files),
            "{files} files after flush {b}"
        );
    }
    t.delete(&Int64Array::from(vec![0, 1, 2])).unwrap();
    for k in 0..3 {
        model.remove(&k);
    }
    assert_eq!(as_map(&t.to_batch()), model);
    assert_eq!(t.len(), model.len());
    drop(t);
    assert!(!spill_dir.exists(), "the table's runs go with it");
}

#[test]
fn a_restore_adopts_the_full_state_as_one_run_without_the_memtable() {
    // 200k keys, far over the 1 MiB budget, in one full capture and a diff.
    let mut plain = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    let pairs: Vec<(i64, i64)> = (0..200_000).rev().map(|k| (k, k * 2)).collect();
    plain.upsert(&rows(&pairs)).unwrap();
    let full = plain.checkpoint(1).unwrap();
    plain.upsert(&rows(&[(5, -5), (300_000, 1)])).unwrap();
    plain.delete(&Int64Array::from(vec![7, 8])).unwrap();
    let diff = plain.checkpoint(2).unwrap();
    assert_eq!(diff.kind, StateKind::Diff { base: 1 });
    let mut t = spilling(StatePolicy::default());
    t.restore(&[(1, full), (2, diff)]).unwrap();
    let stats = t.spill_stats().unwrap();
    assert_eq!((stats.runs, stats.flushes), (1, 0), "{stats:?}");
    assert!(stats.memtable_bytes < 4096, "{stats:?}");
    assert_eq!(t.len(), 200_000 - 2 + 1);
    assert_eq!(as_map(&t.to_batch()), as_map(&plain.to_batch()));
    let (got, present) = t.lookup(&Int64Array::from(vec![5, 7, 9, 300_000])).unwrap();
    assert_eq!(
        present.iter().map(Option::unwrap).collect::<Vec<_>>(),
        [true, false, true, true]
    );
    assert_eq!(got.column(1).as_primitive::<Int64Type>().value(0), -5);
    // The next checkpoint is a diff of what changed since the restore.
    t.upsert(&rows(&[(9, 0)])).unwrap();
    let next = t.checkpoint(3).unwrap();
    assert_eq!(next.kind, StateKind::Diff { base: 2 });
    assert_eq!(next.batch.num_rows(), 1);
}

/// Counts the runs a table hands its sink to keep.
#[derive(Clone, Default)]
struct CountingRuns(Arc<std::sync::atomic::AtomicUsize>);

impl super::RunSink for CountingRuns {
    fn keep(
        &mut self,
        run: crate::state::runs::Run,
    ) -> crate::error::Result<Arc<crate::state::runs::Run>> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Arc::new(run))
    }

    fn release(&mut self, _runs: &[Arc<crate::state::runs::Run>]) {}
}

#[test]
fn a_mapped_restore_takes_a_sorted_full_as_its_base_and_copies_an_unsorted_one() {
    // A sorted full (as the Spark state files and a spilling table's fulls
    // are) and an unsorted one (a plain table's, in slot order).
    // Even keys only: the odd ones in its range are absent, which a base
    // with no filter finds by searching.
    let sorted: Vec<(i64, i64)> = (0..50_000).map(|k| (2 * k, k)).collect();
    let sorted_full = plain_full_of(&sorted);
    let mut plain = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    let reversed: Vec<(i64, i64)> = sorted.iter().rev().copied().collect();
    plain.upsert(&rows(&reversed)).unwrap();
    let unsorted_full = plain.checkpoint(1).unwrap();
    plain.upsert(&rows(&[(5, -5), (90_000, 1)])).unwrap();
    plain.delete(&Int64Array::from(vec![8])).unwrap();
    let diff = plain.checkpoint(2).unwrap();
    let probes = Int64Array::from(vec![5, 6, 8, 99_999, 99_998, 90_000, -1]);
    let (_, want) = plain.lookup(&probes).unwrap();
    assert_eq!(want.true_count(), 4, "{want:?}");
    for (full, copies) in [(sorted_full, 0), (unsorted_full, 1)] {
        let kept = CountingRuns::default();
        let mut t = StateTable::new(schema(), "k", StatePolicy::default())
            .unwrap()
            .with_memory_budget(MIN_STATE_MEMORY, Box::new(kept.clone()))
            .unwrap();
        t.restore_mapped(&[(1, full.clone()), (2, diff.clone())])
            .unwrap();
        let stats = t.spill_stats().unwrap();
        assert_eq!(stats.bases_mapped, 1 - copies as u64, "{stats:?}");
        assert_eq!(kept.0.load(std::sync::atomic::Ordering::Relaxed), copies);
        assert_eq!(as_map(&t.to_batch()), as_map(&plain.to_batch()));
        assert_eq!(t.lookup(&probes).unwrap().1, want);
        // A plain restore of the same chain copies the base whatever its order.
        let kept = CountingRuns::default();
        let mut copied = StateTable::new(schema(), "k", StatePolicy::default())
            .unwrap()
            .with_memory_budget(MIN_STATE_MEMORY, Box::new(kept.clone()))
            .unwrap();
        copied.restore(&[(1, full), (2, diff.clone())]).unwrap();
        assert_eq!(copied.spill_stats().unwrap().bases_mapped, 0);
        assert_eq!(kept.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(as_map(&copied.to_batch()), as_map(&plain.to_batch()));
    }
    // Sorted diffs (as the Spark state files are) become runs as they are:
    // the live count follows each diff's upserts of new keys and deletes of
    // live ones, and reads see the newest run's row.
    plain.upsert(&rows(&[(6, 66), (91_001, 2)])).unwrap();
    plain
        .delete(&Int64Array::from(vec![10, 91_001, 12_345]))
        .unwrap();
    let diff2 = plain.checkpoint(3).unwrap();
    let chain = sorted_chain(&[(1, plain_full_of(&sorted)), (2, diff.clone()), (3, diff2)]);
    let mut t = spilling(StatePolicy::default());
    t.restore_mapped(&chain).unwrap();
    let stats = t.spill_stats().unwrap();
    assert_eq!(
        (stats.bases_mapped, stats.diffs_mapped),
        (1, 2),
        "{stats:?}"
    );
    assert_eq!((stats.runs, stats.flushes), (3, 0), "{stats:?}");
    assert_eq!(t.len(), plain.len());
    assert_eq!(as_map(&t.to_batch()), as_map(&plain.to_batch()));
    let probes = Int64Array::from(vec![5, 6, 8, 10, 91_001, 90_000, 12_345, 7]);
    assert_eq!(
        t.lookup(&probes).unwrap().1,
        plain.lookup(&probes).unwrap().1
    );
    // Writes after the restore go to the memtable over those runs, and the
    // next checkpoint is a diff of them only.
    t.upsert(&rows(&[(10, 1)])).unwrap();
    t.delete(&Int64Array::from(vec![6])).unwrap();
    assert_eq!(t.len(), plain.len());
    let next = t.checkpoint(4).unwrap();
    assert_eq!(next.kind, StateKind::Diff { base: 3 });
    assert_eq!(next.batch.num_rows(), 2);
}

/// Counts the releases of a run's pages.
#[derive(Debug, Default)]
struct CountingPages(std::sync::atomic::AtomicUsize);

impl crate::state::runs::Pages for CountingPages {
    fn release(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl CountingPages {
    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[test]
fn a_mapped_restore_keeps_its_files_pages_and_lookups_release_them_past_their_bound() {
    use crate::state::runs::Pages;
    let sorted: Vec<(i64, i64)> = (0..50_000).map(|k| (2 * k, k)).collect();
    let mut plain = plain_table_of(&[(1, plain_full_of(&sorted))]);
    plain.upsert(&rows(&[(5, -5), (90_000, 1)])).unwrap();
    plain.delete(&Int64Array::from(vec![8])).unwrap();
    let chain = sorted_chain(&[
        (1, plain_full_of(&sorted)),
        (2, plain.checkpoint(2).unwrap()),
    ]);
    let (full, diff) = (
        Arc::new(CountingPages::default()),
        Arc::new(CountingPages::default()),
    );
    let pages: Vec<Option<Arc<dyn Pages>>> = vec![Some(full.clone()), Some(diff.clone())];

    let err = StateTable::new(schema(), "k", StatePolicy::default())
        .unwrap()
        .with_mapped_memory(1 << 20)
        .map(drop)
        .unwrap_err();
    assert!(err.to_string().contains("needs a memory budget"), "{err}");
    let err = spilling(StatePolicy::default())
        .with_mapped_memory(1000)
        .map(drop)
        .unwrap_err();
    assert!(err.to_string().contains("below the minimum"), "{err}");
    let mut t = spilling(StatePolicy::default())
        .with_mapped_memory(MIN_STATE_MEMORY)
        .unwrap();
    let err = t
        .restore_mapped_with_pages(&chain, &pages[..1])
        .unwrap_err();
    assert!(
        err.to_string().contains("one entry (or None) per file"),
        "{err}"
    );
    t.restore_mapped_with_pages(&chain, &pages).unwrap();
    // The restore read the files (order checks, the diff's keys): released.
    let after_restore = (full.count(), diff.count());
    assert!(
        after_restore.0 >= 1 && after_restore.1 >= 1,
        "{after_restore:?}"
    );

    // 1 MiB of pages, a probe counted a page a column (12 KiB): lookups of
    // 40 probes (480 KiB) each stay under it, the third goes past: release.
    for (i, start) in [0, 1_000, 2_000].into_iter().enumerate() {
        let some = Int64Array::from_iter_values((start..start + 40).map(|k| k * 7));
        assert_eq!(t.lookup(&some).unwrap().1, plain.lookup(&some).unwrap().1);
        let want = if i < 2 {
            after_restore.0
        } else {
            after_restore.0 + 1
        };
        assert_eq!(full.count(), want, "after lookup {i}");
    }
    let released = full.count();
    assert!(
        released > after_restore.0,
        "{released} after {after_restore:?}"
    );

    // One lookup of many probes (the files' ~1.4 MB, past the bound) goes
    // in chunks of key order, releasing between them; its answers are the
    // plain table's, in the order asked.
    let many = Int64Array::from_iter_values((0..20_000).map(|i| (i * 7_919) % 100_003));
    let (rows_got, found) = t.lookup(&many).unwrap();
    let (rows_want, want) = plain.lookup(&many).unwrap();
    assert_eq!(found, want);
    assert_eq!(rows_got, rows_want);
    assert!(
        full.count() >= released + 2,
        "{} after {released}",
        full.count()
    );

    // An upsert of 1,000 keys new to the memtable (one slice; the files'
    // ~1.4 MB past the 1 MiB bound: 2 chunks) counts those
    // the runs hold in chunks of key order too, releasing between them:
    // one search of them all would have read the files whole at once.
    let before = full.count();
    let new_rows: Vec<(i64, i64)> = (0..1_000).map(|i| ((i * 7_919) % 100_003, -i)).collect();
    let keys = Int64Array::from_iter_values(new_rows.iter().map(|r| r.0));
    let held = plain.lookup(&keys).unwrap().1.true_count();
    t.upsert(&rows(&new_rows)).unwrap();
    assert_eq!(t.len(), plain.len() + new_rows.len() - held);
    assert!(
        full.count() >= before + 2,
        "{} after {before}",
        full.count()
    );

    // Put aside, a table lets go of them on demand.
    let before = (full.count(), diff.count());
    t.release_pages();
    assert_eq!((full.count(), diff.count()), (before.0 + 1, before.1 + 1));

    // Unbounded (here a lazily opened chain, no budget), lookups never
    // release: only `release_pages` does.
    let lazy_pages = Arc::new(CountingPages::default());
    let mut lazy = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    let only: Vec<Option<Arc<dyn Pages>>> = vec![Some(lazy_pages.clone()), None];
    lazy.restore_mapped_with_pages(&chain, &only).unwrap();
    let restored = lazy_pages.count();
    assert_eq!(lazy.lookup(&many).unwrap(), plain.lookup(&many).unwrap());
    assert_eq!(lazy_pages.count(), restored);
    lazy.release_pages();
    assert_eq!(lazy_pages.count(), restored + 1);
}

#[test]
fn a_table_without_a_budget_opens_a_mapped_chain_lazily_and_a_plain_one_in_memory() {
    // 100k keys sorted (a state file as written) and a sorted diff after it.
    let base: Vec<(i64, i64)> = (0..100_000).map(|k| (k, k)).collect();
    let mut plain = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    plain.upsert(&rows(&base)).unwrap();
    plain.checkpoint(1).unwrap();
    plain.upsert(&rows(&[(7, -7), (200_000, 2)])).unwrap();
    plain.delete(&Int64Array::from(vec![9, 10])).unwrap();
    let diff = plain.checkpoint(2).unwrap();
    let chain = sorted_chain(&[(1, plain_full_of(&base)), (2, diff)]);

    let mut t = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    t.restore_mapped(&chain).unwrap();
    let stats = t
        .spill_stats()
        .expect("a mapped restore opens the table lazily");
    assert_eq!(
        (stats.bases_mapped, stats.diffs_mapped),
        (1, 1),
        "{stats:?}"
    );
    // Nothing of the state was rebuilt in memory.
    assert_eq!(stats.memtable_bytes, 0, "{stats:?}");
    assert_eq!(t.memory_budget(), None);
    assert_eq!(t.len(), plain.len());
    assert_eq!(as_map(&t.to_batch()), as_map(&plain.to_batch()));
    // Writes go to an unbounded memtable: no flush, whatever it holds.
    let many: Vec<(i64, i64)> = (0..40_000).map(|k| (2 * k, -k)).collect();
    t.upsert(&rows(&many)).unwrap();
    plain.upsert(&rows(&many)).unwrap();
    let stats = t.spill_stats().unwrap();
    assert!(stats.memtable_bytes > MIN_STATE_MEMORY, "{stats:?}");
    assert_eq!((stats.flushes, stats.runs), (0, 2), "{stats:?}");
    assert!(t.flush().is_err(), "flush needs a budget");
    // Its checkpoint is O(changed): a diff on the chain (40% of the keys
    // changed), restoring the same state.
    let capture = t.checkpoint(3).unwrap();
    assert_eq!(capture.kind, StateKind::Diff { base: 2 });
    assert_eq!(
        plain.checkpoint(3).unwrap().kind,
        StateKind::Diff { base: 2 }
    );
    let mut chain3 = chain.clone();
    chain3.push((3, capture));
    assert_eq!(
        as_map(&plain_table_of(&chain3).to_batch()),
        as_map(&plain.to_batch())
    );
    assert_eq!(t.len(), plain.len());
    // Once every live key was written again, the runs go: all in memory.
    let mut rest: Vec<(i64, i64)> = (0..100_000)
        .filter(|k| k % 2 == 1 || *k >= 80_000)
        .map(|k| (k, 1))
        .collect();
    rest.push((200_000, 3));
    t.upsert(&rows(&rest)).unwrap();
    plain.upsert(&rows(&rest)).unwrap();
    assert!(t.spill_stats().is_none());
    assert_eq!(t.len(), plain.len());
    assert_eq!(as_map(&t.to_batch()), as_map(&plain.to_batch()));
    let (a, b) = (t.checkpoint(4).unwrap(), plain.checkpoint(4).unwrap());
    assert_eq!((a.kind, as_map(&a.batch)), (b.kind, as_map(&b.batch)));

    // A plain restore puts it back in memory: no runs, no spill stats.
    t.restore(&chain).unwrap();
    assert!(t.spill_stats().is_none());
    assert_eq!(
        as_map(&t.to_batch()),
        as_map(&plain_table_of(&chain).to_batch())
    );
    // An unsorted full cannot be a run as it is: in memory too.
    let mut reversed = base.clone();
    reversed.reverse();
    let mut u = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    u.restore_mapped(&[(1, plain_full_of(&reversed))]).unwrap();
    assert!(u.spill_stats().is_none());
    assert_eq!(u.len(), base.len());
}

fn plain_table_of(chain: &[(CheckpointId, StateCapture)]) -> StateTable {
    let mut t = StateTable::new(schema(), "k", StatePolicy::default()).unwrap();
    t.restore(chain).unwrap();
    t
}

fn plain_full_of(pairs: &[(i64, i64)]) -> StateCapture {
    StateCapture {
        kind: StateKind::Full,
        batch: rows(pairs),
        filter: None,
        times: None,
    }
}

#[test]
fn an_upsert_after_a_lookup_searches_the_runs_once() {
    let mut hinted = spilling(StatePolicy::default());
    let mut plain = spilling(StatePolicy::default());
    for t in [&mut hinted, &mut plain] {
        let pairs: Vec<(i64, i64)> = (0..30_000).map(|k| (k, k)).collect();
        t.upsert(&rows(&pairs)).unwrap();
        t.flush().unwrap();
        t.delete(&Int64Array::from(vec![3])).unwrap();
    }
    // Keys in the runs, one deleted since the flush (a shadow), and a new one.
    let keys = Int64Array::from(vec![1, 2, 3, 50_000, 29_999]);
    let batch = rows(&[(1, -1), (2, -2), (3, -3), (50_000, 5), (29_999, 9)]);
    let (_, present) = hinted.lookup(&keys).unwrap();
    let probes = hinted.spill_stats().unwrap().run_probes;
    hinted.upsert_looked_up(&batch, &present).unwrap();
    assert_eq!(
        hinted.spill_stats().unwrap().run_probes,
        probes,
        "no second search"
    );
    plain.upsert(&batch).unwrap();
    assert_eq!(hinted.len(), plain.len());
    assert_eq!(hinted.len(), 30_000 - 1 + 2);
    assert_eq!(as_map(&hinted.to_batch()), as_map(&plain.to_batch()));
    let short = BooleanArray::from(vec![true]);
    let err = hinted
        .upsert_looked_up(&batch, &short)
        .unwrap_err()
        .to_string();
    assert!(err.contains("present mask has 1 values"), "{err}");
}

#[cfg(target_os = "linux")]
#[test]
fn spill_directories_of_processes_gone_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let gone = child.id();
    child.wait().unwrap();
    let orphan = dir.path().join(format!("spill-{gone}-0"));
    let alive = dir.path().join("spill-1-0"); // init never exits
    let mine = dir.path().join(format!("spill-{}-999", std::process::id()));
    let other = dir.path().join("not-a-spill-dir");
    for d in [&orphan, &alive, &mine, &other] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("run-000000.arrow"), b"x").unwrap();
    }
    let runs = LocalRuns::new(dir.path()).unwrap();
    assert!(!orphan.exists(), "a killed process's runs are removed");
    for d in [&alive, &mine, &other, &runs.dir().to_path_buf()] {
        assert!(d.exists(), "{} stays", d.display());
    }
}

#[test]
fn bad_budgets_and_sizes_are_refused_with_what_to_do() {
    let small = StateTable::new(schema(), "k", StatePolicy::default())
        .unwrap()
        .with_memory_budget(1000, Box::new(InMemoryRuns))
        .unwrap_err()
        .to_string();
    assert!(
        small.contains("1000 bytes") && small.contains("1048576"),
        "{small}"
    );
    let grouped = StateTable::new(schema(), "k", StatePolicy::default())
        .unwrap()
        .with_group("v")
        .unwrap()
        .with_memory_budget(MIN_STATE_MEMORY, Box::new(InMemoryRuns))
        .unwrap_err()
        .to_string();
    assert!(grouped.contains("group column"), "{grouped}");
    assert_eq!(parse_memory("256MB").unwrap(), 256 << 20);
    assert_eq!(parse_memory(" 256m ").unwrap(), 256 << 20);
    assert_eq!(parse_memory("1GiB").unwrap(), 1 << 30);
    assert_eq!(parse_memory("4096").unwrap(), 4096);
    for bad in [
        "",
        "MB",
        "12 parsecs",
        "-5",
        "1.5GB",
        "99999999999999999999t",
    ] {
        let e = parse_memory(bad).unwrap_err().to_string();
        assert!(e.contains("256MB"), "{bad}: {e}");
    }
}

/// A run of `keys` (any order) whose value is `tag`, `dead` keys tombstones.
fn tagged_run(keys: impl Iterator<Item = i64>, tag: i64, dead: &[i64]) -> crate::state::runs::Run {
    let keys: Vec<i64> = keys.chain(dead.iter().copied()).collect();
    let live = keys.len() - dead.len();
    let diff = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("__deleted", DataType::Boolean, false),
    ]));
    let batch = RecordBatch::try_new(
        diff,
        vec![
            Arc::new(Int64Array::from(keys.clone())),
            Arc::new(Int64Array::from_iter(
                (0..keys.len()).map(|i| (i < live).then_some(tag)),
            )),
            Arc::new(StringArray::from_iter((0..keys.len()).map(|i| {
                (i < live && i % 4 != 0).then(|| format!("t{tag}-{i}"))
            }))),
            Arc::new(BooleanArray::from_iter(
                (0..keys.len()).map(|i| Some(i >= live)),
            )),
        ],
    )
    .unwrap();
    crate::state::runs::Run::from_unsorted(batch, "k", crate::state::runs::DEFAULT_FPP).unwrap()
}

#[test]
fn a_local_merge_is_written_as_it_merges_and_reads_as_merge_does() {
    use crate::state::runs::{merge, MergeCursor};
    use crate::state::RunSink;
    // Several chunks' worth of rows (RUN_CHUNK_ROWS is 64k), with
    // overlaps, tombstones and nulls, so that chunk boundaries and the
    // page releases between chunks fall inside the merge.
    let dir = tempfile::tempdir().unwrap();
    let mut sink = LocalRuns::new(dir.path()).unwrap();
    let older = sink.keep(tagged_run(0..150_000, 1, &[])).unwrap();
    let newer = sink
        .keep(tagged_run(
            (100_000..220_000).step_by(2),
            2,
            &[5, 7, 149_999],
        ))
        .unwrap();
    let runs = [newer.as_ref(), older.as_ref()];
    for drop_tombstones in [false, true] {
        let want = merge(&runs, drop_tombstones, crate::state::runs::DEFAULT_FPP).unwrap();
        let mut cursor = MergeCursor::new(&runs, drop_tombstones).unwrap();
        let kept = sink.keep_chunks(&mut cursor).unwrap();
        assert_eq!(
            kept.batch(),
            want.run.batch(),
            "drop_tombstones {drop_tombstones}"
        );
        assert_eq!(kept.is_base(), drop_tombstones);
        assert!(kept.filter().is_some(), "a merged run filters its lookups");
        // Its pages released, the mapped run still reads its rows.
        kept.release_pages();
        let probes = Int64Array::from(vec![5, 99_999, 100_000, 100_001, 219_998, 500_000]);
        let found: Vec<Option<u32>> = kept.find(&probes).unwrap();
        let expect: Vec<Option<u32>> = want.run.find(&probes).unwrap();
        assert_eq!(found, expect);
    }
    // The merges' files are the sink's, and no spool file is left.
    let names: Vec<String> = std::fs::read_dir(sink.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("run-") && n.ends_with(".arrow")),
        "{names:?}"
    );
}

/// A capture's state file as the in-memory path writes it: the bytes and
/// the filter (`encode_state`'s steps: stored schema, sorted, encoded).
fn state_file_bytes(batch: &RecordBatch, diff: bool) -> (Vec<u8>, Option<Vec<u8>>) {
    use crate::store::format;
    let batch = format::state_batch(batch, "k", diff).unwrap();
    let batch = format::sort_by_key(&batch, "k").unwrap();
    let filter = if diff {
        format::diff_filter(std::slice::from_ref(&batch), "k").unwrap()
    } else {
        None
    };
    let (bytes, _) = format::encode_ipc(&batch.schema(), &[batch], "t").unwrap();
    (bytes, filter)
}

#[test]
fn a_streamed_checkpoint_writes_the_bytes_of_the_checkpoint_in_memory() {
    use super::CaptureRows;
    use crate::store::{format, write_state_runs, Fsync, FsyncMode};
    // Two tables fed the same changes under the same small budget: one
    // checkpoints in memory, the other streamed (flushed, then merged as
    // its file is written). Fulls, diffs with deletes, and an empty diff.
    let dir = tempfile::tempdir().unwrap();
    let policy = StatePolicy { full_every: 3 };
    let table = |dir: &std::path::Path| {
        StateTable::new(schema(), "k", policy)
            .unwrap()
            .with_memory_budget(MIN_STATE_MEMORY, Box::new(LocalRuns::new(dir).unwrap()))
            .unwrap()
    };
    let (mut memory, mut streamed) = (table(dir.path()), table(dir.path()));
    let mut runs_written = 0;
    for id in 1..=7u64 {
        for t in [&mut memory, &mut streamed] {
            if id != 5 {
                let n = id as i64;
                let pairs: Vec<(i64, i64)> = (0..40_000)
                    .map(|i| ((i * 7 + n * 1_000) % 90_000, i + n))
                    .collect();
                t.upsert(&rows(&pairs)).unwrap();
                t.delete(&Int64Array::from_iter_values((0..50).map(|i| i * 13 + n)))
                    .unwrap();
            }
        }
        let want = memory.checkpoint(id).unwrap();
        let got = streamed.checkpoint_streamed(id).unwrap();
        assert_eq!(got.kind, want.kind, "checkpoint {id}");
        let diff = matches!(want.kind, StateKind::Diff { .. });
        let expected = state_file_bytes(&want.batch, diff);
        let actual = match got.rows {
            CaptureRows::Batch(batch) => state_file_bytes(&batch, diff),
            CaptureRows::Runs { runs, base, schema } => {
                assert_eq!(base, !diff);
                runs_written += 1;
                let path = dir.path().join(format!("chk-{id}.arrow"));
                let schema = format::state_schema(&schema, "k", diff).unwrap();
                let fsync = Fsync::new(FsyncMode::Off);
                let (w, filter) =
                    write_state_runs(&path, dir.path(), &runs, base, schema, "k", &fsync).unwrap();
                let bytes = std::fs::read(&path).unwrap();
                assert_eq!(w.bytes, bytes.len() as u64);
                (bytes, filter)
            }
        };
        assert!(
            actual.0 == expected.0,
            "checkpoint {id}: the state files differ"
        );
        assert_eq!(actual.1, expected.1, "checkpoint {id}: the filters differ");
        assert_eq!(as_map(&streamed.to_batch()), as_map(&memory.to_batch()));
    }
    // Every checkpoint but the empty one had runs to merge.
    assert!(runs_written >= 5, "{runs_written}");
}
