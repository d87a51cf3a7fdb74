//! Random tables, checkpoints, aborts and retention against a model: every
//! checkpoint the store still lists rebuilds exactly the state it captured.

use crate::store_common;

use std::collections::BTreeMap;

use proptest::prelude::*;
use snapcut_core::snapshot::{SnapshotSink, TaskSnapshot};
use snapcut_core::store::{SnapshotStore, StoreOptions};
use store_common::*;

#[derive(Clone, Debug)]
enum Op {
    Upsert(Vec<i64>, i64),
    Delete(Vec<i64>),
    Commit,
    Abort,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (proptest::collection::vec(0i64..30, 1..6), any::<i32>()).prop_map(|(k, v)| Op::Upsert(k, v.into())),
        1 => proptest::collection::vec(0i64..30, 1..4).prop_map(Op::Delete),
        2 => Just(Op::Commit),
        1 => Just(Op::Abort),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn retained_checkpoints_rebuild_their_state(
        ops in proptest::collection::vec(op(), 1..40),
        retain in 1usize..4,
        full_every in 1u32..5,
        materialize in proptest::option::of(1usize..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions { retain, materialize_every: materialize, ..Default::default() };
        let store = SnapshotStore::open(dir.path(), options).unwrap();
        let mut t = table(full_every);
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
                Op::Abort => {
                    id += 1;
                    let state = t.checkpoint(id).unwrap();
                    store.task_snapshot(id, TaskSnapshot {
                        task: task("agg", 0), state: Some(state), state_runs: None, channels: vec![],
                        source_offset: None, alignment_nanos: 0, sent_seq: Vec::new(), taken_seq: Vec::new(),
                    }).unwrap();
                    store.abort(id).unwrap();
                    t.checkpoint_aborted();
                }
            }
        }
        let listed = store.reader().list().unwrap();
        prop_assert_eq!(&listed, &store.completed());
        // Exactly the newest `retain` stay complete (nothing staged, no
        // savepoint): older runs they read are held, not kept whole.
        let mut newest: Vec<u64> = at.keys().rev().take(retain).copied().collect();
        newest.reverse();
        prop_assert_eq!(&listed, &newest);
        // A held directory keeps only files a listed checkpoint or a
        // compaction in flight reads.
        let mut reads = store.compaction_inputs();
        for id in &listed {
            reads.extend(store.reader().manifest(*id).unwrap().reads());
        }
        let held = store.reader().held().unwrap();
        prop_assert_eq!(&held, &store.held());
        for (id, files) in held {
            prop_assert!(!files.is_empty(), "held {} holds nothing", id);
            for f in files {
                prop_assert!(reads.contains(&(id, f.clone())), "held {} keeps {} nobody reads", id, f);
            }
        }
        prop_assert!(store.reader().partial().unwrap().is_empty());
        for id in listed {
            store.reader().verify(id).unwrap();
            let got = as_map(&store.reader().state(id, &task("agg", 0)).unwrap().unwrap());
            prop_assert_eq!(&got, &at[&id], "checkpoint {}", id);
        }
        // Reopened, the store finds the same held directories.
        drop(store);
        let store = SnapshotStore::open(dir.path(), StoreOptions { retain, ..Default::default() }).unwrap();
        prop_assert_eq!(store.held(), store.reader().held().unwrap());
        prop_assert_eq!(store.completed(), newest);
    }
}
