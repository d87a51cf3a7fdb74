//! The durable store end to end: commit, read back, chains, retention, abort.

use crate::store_common;

use std::collections::BTreeMap;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::Int64Array;
use snapcut_core::snapshot::SnapshotSink;
use snapcut_core::store::{
    state_file_name, FileKind, FileRole, FsyncMode, SnapshotReader, SnapshotStore, StoreOptions,
    MANIFEST_FILE,
};
use snapcut_core::Error;
use store_common::*;

#[test]
fn state_rebuilds_at_every_retained_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(
        dir.path(),
        StoreOptions {
            retain: 100,
            ..Default::default()
        },
    )
    .unwrap();
    let mut t = table(3);
    let mut expected = BTreeMap::new();
    for id in 1..=7u64 {
        let keys = (id as i64 * 5)..(id as i64 * 5 + 10);
        t.upsert(&rows(keys.clone(), id as i64 * 100)).unwrap();
        for k in keys {
            expected.insert(k, k + id as i64 * 100);
        }
        if id % 2 == 0 {
            t.delete(&Int64Array::from(vec![id as i64 * 5])).unwrap();
            expected.remove(&(id as i64 * 5));
        }
        checkpoint(&store, &mut t, id, false);
        let reader = SnapshotReader::open(dir.path()).unwrap();
        let state = reader.state(id, &task("agg", 0)).unwrap().unwrap();
        assert_eq!(as_map(&state), expected, "checkpoint {id}");
    }
    let reader = store.reader();
    assert_eq!(reader.list().unwrap(), (1..=7).collect::<Vec<_>>());
    let m = reader.verify(6).unwrap();
    let f = m.state_file(&task("agg", 0)).unwrap();
    assert_eq!(f.kind, Some(FileKind::Diff));
    assert_eq!(f.base, Some(5));
    assert_eq!(f.chain, vec![4, 5, 6]);
    assert_eq!(f.key.as_deref(), Some("k"));
    assert_eq!(m.protocol, "aligned");
    assert_eq!(m.graph_fingerprint, "g1");
    assert_eq!(reader.source_offsets(6).unwrap()[&task("src", 0)], 60);
    let ch = reader.channels(6, &task("agg", 0)).unwrap();
    assert_eq!(ch.len(), 1);
    assert_eq!(ch[0].edge, "agg<-loop");
    assert_eq!(ch[0].input, 1);
    assert_eq!(
        ch[0].records[0]
            .column(0)
            .as_primitive::<Int64Type>()
            .value(0),
        6
    );
    assert!(m
        .files
        .iter()
        .any(|f| f.role == FileRole::Sources && f.rows == 1));
    assert!(dir
        .path()
        .join("chk-00000006/agg-0.channel-agg%3C-loop.0.arrow")
        .is_file());
    assert_eq!(reader.next_checkpoint_id().unwrap(), 8);
}

#[test]
fn retention_keeps_savepoints_and_needed_bases() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(
        dir.path(),
        StoreOptions {
            retain: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let mut t = table(4); // full at 1, 5, 9; diffs between
    for id in 1..=7u64 {
        t.upsert(&rows([id as i64], 0)).unwrap();
        checkpoint(&store, &mut t, id, id == 2);
    }
    // Kept: 6, 7 (retain 2) and savepoint 2; held for the runs they read:
    // 5 (their full) and 1 (2's full).
    let held = || store.held().into_keys().collect::<Vec<_>>();
    assert_eq!(store.completed(), vec![2, 6, 7]);
    assert_eq!(store.reader().list().unwrap(), vec![2, 6, 7]);
    assert_eq!(held(), vec![1, 5]);
    for id in [2, 6, 7] {
        store.reader().verify(id).unwrap();
    }
    let s7 = store.reader().state(7, &task("agg", 0)).unwrap().unwrap();
    assert_eq!(s7.num_rows(), 7);
    for id in 8..=9u64 {
        t.upsert(&rows([id as i64], 0)).unwrap();
        checkpoint(&store, &mut t, id, false);
    }
    // 9 is full; 8 reads 5..8; 2 stays, a savepoint.
    assert_eq!(store.completed(), vec![2, 8, 9]);
    assert_eq!(held(), vec![1, 5, 6, 7]);
    let s2 = store.reader().state(2, &task("agg", 0)).unwrap().unwrap();
    assert_eq!(s2.num_rows(), 2);
}

#[test]
fn abort_removes_partial_and_table_goes_full() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), StoreOptions::default()).unwrap();
    let mut t = table(10);
    t.upsert(&rows(0..10, 0)).unwrap();
    checkpoint(&store, &mut t, 1, false);
    t.upsert(&rows(10..12, 0)).unwrap();
    let cap = t.checkpoint(2).unwrap();
    store
        .task_snapshot(
            2,
            snapcut_core::snapshot::TaskSnapshot {
                task: task("agg", 0),
                state: Some(cap),
                state_runs: None,
                channels: vec![],
                source_offset: None,
                alignment_nanos: 0,
                sent_seq: Vec::new(),
                taken_seq: Vec::new(),
            },
        )
        .unwrap();
    store.abort(2).unwrap();
    t.checkpoint_aborted();
    assert!(!dir.path().join("chk-00000002").exists());
    checkpoint(&store, &mut t, 3, false);
    let m = store.reader().verify(3).unwrap();
    assert_eq!(
        m.state_file(&task("agg", 0)).unwrap().kind,
        Some(FileKind::Full)
    );
    assert_eq!(
        store
            .reader()
            .state(3, &task("agg", 0))
            .unwrap()
            .unwrap()
            .num_rows(),
        12
    );
}

#[test]
fn diff_on_uncommitted_base_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), StoreOptions::default()).unwrap();
    let mut t = table(10);
    t.upsert(&rows(0..3, 0)).unwrap();
    t.checkpoint(1).unwrap(); // never stored
    t.upsert(&rows(3..4, 0)).unwrap();
    let cap = t.checkpoint(2).unwrap();
    store
        .task_snapshot(
            2,
            snapcut_core::snapshot::TaskSnapshot {
                task: task("agg", 0),
                state: Some(cap),
                state_runs: None,
                channels: vec![],
                source_offset: None,
                alignment_nanos: 0,
                sent_seq: Vec::new(),
                taken_seq: Vec::new(),
            },
        )
        .unwrap();
    let err = store.commit(meta(2, false)).unwrap_err();
    assert!(matches!(err, Error::Snapshot(_)));
    assert!(err.to_string().contains("based on checkpoint 1"), "{err}");
    assert!(!dir.path().join("chk-00000002").join(MANIFEST_FILE).exists());
    assert!(store.reader().list().unwrap().is_empty());
}

#[test]
fn committed_checkpoint_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), StoreOptions::default()).unwrap();
    let mut t = table(10);
    t.upsert(&rows(0..3, 0)).unwrap();
    checkpoint(&store, &mut t, 1, false);
    let before = std::fs::read(dir.path().join("chk-00000001").join(MANIFEST_FILE)).unwrap();
    let err = store.commit(meta(1, false)).unwrap_err();
    assert!(err.to_string().contains("already committed"), "{err}");
    let err = store
        .task_snapshot(
            1,
            snapcut_core::snapshot::TaskSnapshot {
                task: task("x", 0),
                state: None,
                state_runs: None,
                channels: vec![],
                source_offset: Some(1),
                alignment_nanos: 0,
                sent_seq: Vec::new(),
                taken_seq: Vec::new(),
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("already committed"), "{err}");
    let after = std::fs::read(dir.path().join("chk-00000001").join(MANIFEST_FILE)).unwrap();
    assert_eq!(before, after);
}

#[test]
fn unwritable_root_is_an_io_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let root = file.join("snapshots");
    let err = SnapshotStore::open(&root, StoreOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&root.display().to_string()),
        "{err}"
    );
    let err = SnapshotStore::open(
        dir.path(),
        StoreOptions {
            retain: 0,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)));
}

#[test]
fn write_failure_leaves_previous_checkpoints_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), StoreOptions::default()).unwrap();
    let mut t = table(10);
    t.upsert(&rows(0..3, 0)).unwrap();
    checkpoint(&store, &mut t, 1, false);
    // Block checkpoint 2's directory with a plain file: writing into it fails.
    std::fs::write(dir.path().join("chk-00000002"), b"in the way").unwrap();
    t.upsert(&rows(5..6, 0)).unwrap();
    let cap = t.checkpoint(2).unwrap();
    store
        .task_snapshot(
            2,
            snapcut_core::snapshot::TaskSnapshot {
                task: task("agg", 0),
                state: Some(cap),
                state_runs: None,
                channels: vec![],
                source_offset: None,
                alignment_nanos: 0,
                sent_seq: Vec::new(),
                taken_seq: Vec::new(),
            },
        )
        .unwrap();
    let err = store.commit(meta(2, false)).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("chk-00000002"), "{err}");
    assert_eq!(store.reader().list().unwrap(), vec![1]);
    store.reader().verify(1).unwrap();
    assert_eq!(
        store
            .reader()
            .state(1, &task("agg", 0))
            .unwrap()
            .unwrap()
            .num_rows(),
        3
    );
}

#[test]
fn load_gives_the_runtime_a_completed_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), StoreOptions::default()).unwrap();
    let mut t = table(10);
    t.upsert(&rows(0..5, 1)).unwrap();
    checkpoint(&store, &mut t, 1, false);
    t.upsert(&rows(5..6, 1)).unwrap();
    t.delete(&Int64Array::from(vec![0])).unwrap();
    checkpoint(&store, &mut t, 2, true);
    let (loaded, skipped) = store.reader().load_latest_intact().unwrap();
    assert!(skipped.is_empty());
    assert_eq!(loaded.meta, {
        let mut m = meta(2, true);
        m.started_ms = 1002;
        m
    });
    let agg = &loaded.tasks[&task("agg", 0)];
    let state = agg.state.as_ref().unwrap();
    assert_eq!(state.kind, snapcut_core::snapshot::StateKind::Full);
    assert_eq!(as_map(&state.batch), (1..6).map(|k| (k, k + 1)).collect());
    assert_eq!(agg.channels.len(), 1);
    assert_eq!(loaded.tasks[&task("src", 0)].source_offset, Some(20));
    // A table restored from the loaded state continues with diffs based on 2.
    let mut r = table(10);
    r.restore(&[(2, state.clone())]).unwrap();
    r.upsert(&rows([9], 0)).unwrap();
    assert_eq!(
        r.checkpoint(3).unwrap().kind,
        snapcut_core::snapshot::StateKind::Diff { base: 2 }
    );
}

/// A store that writes state files sorted by key (as under a memory
/// budget), so a restore can take them as runs; and its directory.
fn sorted_store() -> (tempfile::TempDir, std::sync::Arc<SnapshotStore>) {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        sort_state_files: true,
        ..Default::default()
    };
    let store = SnapshotStore::open(dir.path(), options).unwrap();
    (dir, store)
}

#[test]
fn a_restore_point_holds_state_as_mapped_runs_and_refuses_a_corrupt_one() {
    use snapcut_core::snapshot::StateKind;
    let (dir, store) = sorted_store();
    let mut t = table(10);
    // Captures in the table's (arrival) order; this store writes them sorted.
    t.upsert(&rows([3, 0, 4, 1, 2], 1)).unwrap();
    checkpoint(&store, &mut t, 1, false);
    t.upsert(&rows([7, 5], 1)).unwrap();
    t.delete(&Int64Array::from(vec![0])).unwrap();
    checkpoint(&store, &mut t, 2, true);
    let (loaded, skipped) = store.reader().restore_point().unwrap();
    assert!(skipped.is_empty());
    let loaded = loaded.unwrap();
    let agg = task("agg", 0);
    // Nothing rebuilt: the task's state is its runs, the full then the diff.
    assert!(loaded.tasks[&agg].state.is_none());
    let runs = &loaded.state_runs[&agg];
    let kinds: Vec<_> = runs.iter().map(|(id, c)| (*id, c.kind)).collect();
    assert_eq!(
        kinds,
        vec![(1, StateKind::Full), (2, StateKind::Diff { base: 1 })]
    );
    assert!(!loaded.state_runs.contains_key(&task("src", 0)));
    let sorted: Vec<Vec<i64>> = runs
        .iter()
        .map(|(_, c)| {
            let k = c
                .batch
                .column_by_name("k")
                .unwrap()
                .as_primitive::<Int64Type>();
            k.values().to_vec()
        })
        .collect();
    assert_eq!(sorted, vec![vec![0, 1, 2, 3, 4], vec![0, 5, 7]]);
    let rebuilt = snapcut_core::store::rebuild_chain(runs).unwrap();
    assert_eq!(
        as_map(&rebuilt),
        [1, 2, 3, 4, 5, 7].map(|k| (k, k + 1)).into_iter().collect()
    );
    assert_eq!(
        rebuilt,
        store.reader().state(2, &agg).unwrap().unwrap(),
        "the runs rebuild what the eager load does"
    );
    // A run file flipped on disk: the restore point passes over checkpoint 2
    // (its diff) and names why, and checkpoint 1 restores.
    let diff = dir.path().join("chk-00000002").join(state_file_name(&agg));
    let mut bytes = std::fs::read(&diff).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    replace_file(&diff, bytes);
    let (loaded, skipped) = store.reader().restore_point().unwrap();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0].reason.contains("checksum"), "{skipped:?}");
    assert_eq!(loaded.unwrap().meta.id, 1);
    let err = store.reader().state_runs(2, &agg).unwrap_err();
    assert!(err.to_string().contains("corrupt"), "{err}");
}

#[test]
fn a_task_reports_once_per_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), StoreOptions::default()).unwrap();
    let snap = || snapcut_core::snapshot::TaskSnapshot {
        task: task("src", 0),
        state: None,
        state_runs: None,
        channels: vec![],
        source_offset: Some(1),
        alignment_nanos: 0,
        sent_seq: Vec::new(),
        taken_seq: Vec::new(),
    };
    store.task_snapshot(1, snap()).unwrap();
    let err = store.task_snapshot(1, snap()).unwrap_err();
    assert!(err.to_string().contains("reported twice"), "{err}");
}

#[test]
fn operator_states_without_key_metadata_round_trip_as_full() {
    use arrow_array::RecordBatch;
    use snapcut_core::snapshot::{StateCapture, StateKind, TaskSnapshot};
    let dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(dir.path(), StoreOptions::default()).unwrap();
    let plain = RecordBatch::try_from_iter([(
        "sum",
        std::sync::Arc::new(Int64Array::from(vec![3, 4])) as _,
    )])
    .unwrap();
    let snap = |kind| TaskSnapshot {
        task: task("agg", 1),
        state: Some(StateCapture {
            kind,
            batch: plain.clone(),
            filter: None,
            times: None,
        }),
        state_runs: None,
        channels: vec![],
        source_offset: None,
        alignment_nanos: 0,
        sent_seq: Vec::new(),
        taken_seq: Vec::new(),
    };
    store.task_snapshot(1, snap(StateKind::Full)).unwrap();
    store.commit(meta(1, false)).unwrap();
    let loaded = store.reader().load(1).unwrap();
    assert_eq!(
        loaded.tasks[&task("agg", 1)].state.as_ref().unwrap().batch,
        plain
    );
    // A diff needs the key named in its schema metadata to be rebuilt.
    store
        .task_snapshot(2, snap(StateKind::Diff { base: 1 }))
        .unwrap();
    store.commit(meta(2, false)).unwrap();
    let err = store.reader().state(2, &task("agg", 1)).unwrap_err();
    assert!(err.to_string().contains("snapcut.key"), "{err}");
}

#[test]
fn store_compacts_runs_so_tables_send_only_diffs() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        retain: 1,
        materialize_every: Some(3),
        ..Default::default()
    };
    let store = SnapshotStore::open(dir.path(), options).unwrap();
    let mut t = table(u32::MAX); // only the very first capture is full
    let mut expected = BTreeMap::new();
    for id in 1..=8u64 {
        let k = id as i64;
        t.upsert(&rows([k, k + 100], k)).unwrap();
        expected.insert(k, 2 * k);
        expected.insert(k + 100, k + 100 + k);
        if id > 2 {
            t.delete(&Int64Array::from(vec![k - 2])).unwrap();
            expected.remove(&(k - 2));
        }
        checkpoint(&store, &mut t, id, false);
        // The merge handed over at one commit is adopted by the next.
        assert!(store.wait_for_compactions(std::time::Duration::from_secs(60)));
        let m = store.reader().verify(id).unwrap();
        let f = m.state_file(&task("agg", 0)).unwrap();
        assert!(f.runs.len() <= 4, "checkpoint {id}: runs {:?}", f.runs);
        assert_eq!(
            as_map(&store.reader().state(id, &task("agg", 0)).unwrap().unwrap()),
            expected,
            "checkpoint {id}"
        );
    }
    // Runs: 1 full, 2-4 diffs (a base merge handed over), 5 adopts the
    // full of 1-4, 6-7 diffs, 8 adopts the full of 1-7.
    let m = store.reader().manifest(8).unwrap();
    let runs = &m.state_file(&task("agg", 0)).unwrap().runs;
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1].kind, FileKind::Full);
    // Named by its span (the ends: its entry does not grow with the history).
    assert_eq!(runs[1].merges, vec![1, 7]);
    assert_eq!(store.completed(), vec![8]);
}

#[test]
fn every_fsync_mode_writes_the_same_checkpoints() {
    let run = |fsync: FsyncMode| {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::open(
            dir.path(),
            StoreOptions {
                retain: 10,
                fsync,
                ..Default::default()
            },
        )
        .unwrap();
        let mut t = table(3);
        let mut states = Vec::new();
        for id in 1..=3u64 {
            t.upsert(&rows(0..(id as i64 * 4), id as i64)).unwrap();
            checkpoint(&store, &mut t, id, false);
            let reader = SnapshotReader::open(dir.path()).unwrap();
            reader.verify(id).unwrap();
            states.push(as_map(&reader.state(id, &task("agg", 0)).unwrap().unwrap()));
        }
        (states, store.fsync_calls())
    };
    let (per_file, per_file_calls) = run(FsyncMode::PerFile);
    // Per checkpoint: the state file, the channel file, sources.arrow, the
    // manifest, the checkpoint's directory and the root.
    assert_eq!(per_file_calls, 3 * 6);
    let (syncfs, syncfs_calls) = run(FsyncMode::Syncfs);
    assert_eq!(syncfs, per_file);
    assert_eq!(StoreOptions::default().fsync, FsyncMode::Syncfs);
    let in_effect = SnapshotStore::open(tempfile::tempdir().unwrap().path(), Default::default())
        .unwrap()
        .fsync_mode();
    // Per checkpoint: one syncfs before the manifest's rename, one directory
    // fsync after it (where syncfs is not available: as per-file).
    let expected = if in_effect == FsyncMode::Syncfs { 2 } else { 6 };
    assert_eq!(syncfs_calls, 3 * expected);
    let (off, off_calls) = run(FsyncMode::Off);
    assert_eq!(off, per_file);
    assert_eq!(off_calls, 0);
    assert!("sometimes"
        .parse::<FsyncMode>()
        .unwrap_err()
        .to_string()
        .contains("'per-file', 'syncfs', 'off'"));
}

#[test]
fn a_diff_restores_with_its_stored_filter_and_a_corrupt_or_missing_one_is_refused() {
    use snapcut_core::snapshot::StateKind;
    use snapcut_core::state::runs::hash::hash_int;
    use snapcut_core::store::filter_file_name;
    let (dir, store) = sorted_store();
    let mut t = table(10);
    t.upsert(&rows(0..1000, 1)).unwrap();
    checkpoint(&store, &mut t, 1, false);
    t.upsert(&rows([5, 2000, 3000], 7)).unwrap();
    t.delete(&Int64Array::from(vec![6])).unwrap();
    checkpoint(&store, &mut t, 2, false);
    t.upsert(&rows([4000], 1)).unwrap();
    checkpoint(&store, &mut t, 3, false);
    let agg = task("agg", 0);
    // Each diff's filter beside it, named by its entry; the full has none.
    let manifest = store.reader().verify(3).unwrap();
    let entry = manifest.state_file(&agg).unwrap();
    let filters: Vec<_> = entry.runs.iter().map(|r| r.filter.clone()).collect();
    assert!(filters[0].is_some() && filters[1].is_some() && filters[2].is_none());
    let (loaded, skipped) = store.reader().restore_point().unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    let runs = loaded.unwrap().state_runs[&agg].clone();
    let diff_keys = [vec![5, 6, 2000, 3000], vec![4000]];
    for ((_, capture), keys) in runs[1..].iter().zip(&diff_keys) {
        assert!(matches!(capture.kind, StateKind::Diff { .. }));
        let filter = capture.filter.as_ref().expect("a diff's stored filter");
        assert!(keys.iter().all(|&k| filter.may_contain(hash_int(k))));
    }
    assert!(runs[0].1.filter.is_none());
    // A lazy restore takes them as the runs' filters, no key hashed again.
    let mut lazy = table(10);
    lazy.restore_mapped(&runs).unwrap();
    let stats = lazy.spill_stats().unwrap();
    assert_eq!(
        (stats.diffs_mapped, stats.filters_stored),
        (2, 2),
        "{stats:?}"
    );
    assert_eq!(
        as_map(&lazy.to_batch()),
        as_map(&store.reader().state(3, &agg).unwrap().unwrap())
    );
    // A filter flipped on disk: verify names it, the restore point passes
    // over the checkpoints that need it.
    let bloom = dir
        .path()
        .join("chk-00000003")
        .join(filter_file_name(&state_file_name(&agg)));
    let good = std::fs::read(&bloom).unwrap();
    let mut bad = good.clone();
    bad[0] ^= 0xff;
    replace_file(&bloom, &bad);
    let err = store.reader().verify(3).unwrap_err().to_string();
    assert!(
        err.contains("agg-0.state.bloom") && err.contains("checksum"),
        "{err}"
    );
    let (loaded, skipped) = store.reader().restore_point().unwrap();
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0].reason.contains(".bloom"), "{skipped:?}");
    assert_eq!(loaded.unwrap().meta.id, 2);
    assert!(store.reader().state_runs(3, &agg).is_err());
    // A filter gone: named as a missing file, for every checkpoint needing it.
    replace_file(&bloom, &good);
    let two = dir
        .path()
        .join("chk-00000002")
        .join(filter_file_name(&state_file_name(&agg)));
    std::fs::remove_file(&two).unwrap();
    for id in [2, 3] {
        let err = store.reader().verify(id).unwrap_err().to_string();
        assert!(
            err.contains("agg-0.state.bloom") && err.contains("missing"),
            "{err}"
        );
    }
}

/// A spilling table's captures as the runtime hands them over: left as
/// runs, which the store's writer merges into each state file as it writes
/// it. Each file and its manifest entry (sizes, checksum, key range, filter)
/// are those of the same capture merged in memory and written as a batch,
/// and the chain reads back as the table's state.
#[test]
fn a_capture_left_as_runs_is_stored_as_its_merge_in_memory_would_be() {
    use snapcut_core::operator::TaskState;
    use snapcut_core::snapshot::{StateCapture, StateKind, StateRuns, TaskSnapshot};
    use snapcut_core::state::{InMemoryRuns, StatePolicy, StateTable, MIN_STATE_MEMORY};
    fn snap(state: Option<StateCapture>, state_runs: Option<StateRuns>) -> TaskSnapshot {
        TaskSnapshot {
            task: task("agg", 0),
            state,
            state_runs,
            channels: vec![],
            source_offset: None,
            alignment_nanos: 0,
            sent_seq: Vec::new(),
            taken_seq: Vec::new(),
        }
    }
    let (runs_dir, by_runs) = sorted_store();
    let (batch_dir, by_batch) = sorted_store();
    let mut t = StateTable::new(schema(), "k", StatePolicy { full_every: 3 })
        .unwrap()
        .with_memory_budget(MIN_STATE_MEMORY, Box::new(InMemoryRuns))
        .unwrap();
    t.confirm_bases();
    let mut model = BTreeMap::new();
    let mut as_runs = Vec::new();
    for id in 1..=5u64 {
        let n = id as i64;
        if id == 1 {
            // Past the 1 MiB budget: the memtable flushes into runs.
            upsert_both(&mut t, &mut model, &(0..60_000).collect::<Vec<_>>(), 0);
        } else {
            let changed: Vec<i64> = (n * 1_000..n * 1_000 + 500).collect();
            upsert_both(&mut t, &mut model, &changed, n);
            delete_both(&mut t, &mut model, &[n * 7, 59_999 - n, 1_000_000 + n]);
        }
        let state: TaskState = t.checkpoint_streamed(id).unwrap().into();
        let (runs, batch) = match state {
            TaskState::Runs(r) => {
                as_runs.push(r.kind);
                let merged = r.to_capture().unwrap();
                (snap(None, Some(r)), snap(Some(merged), None))
            }
            TaskState::Capture(c) => (snap(Some(c.clone()), None), snap(Some(c), None)),
        };
        by_runs.task_snapshot(id, runs).unwrap();
        by_runs.commit(meta(id, false)).unwrap();
        by_batch.task_snapshot(id, batch).unwrap();
        by_batch.commit(meta(id, false)).unwrap();
        t.checkpoint_committed(id);
        let name = |dir: &std::path::Path| {
            let d = dir.join(snapcut_core::store::checkpoint_dir_name(id));
            let m: serde_json::Value =
                serde_json::from_slice(&std::fs::read(d.join(MANIFEST_FILE)).unwrap()).unwrap();
            let state = m["files"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["role"] == "state")
                .unwrap()
                .clone();
            let bytes = std::fs::read(d.join(state["path"].as_str().unwrap())).unwrap();
            (state, bytes)
        };
        assert_eq!(
            name(runs_dir.path()),
            name(batch_dir.path()),
            "checkpoint {id}"
        );
        let stored = by_runs
            .reader()
            .state(id, &task("agg", 0))
            .unwrap()
            .unwrap();
        assert_eq!(as_map(&stored), model, "checkpoint {id}");
    }
    // A task reports its state once: as a capture or as runs, not both.
    let mut t2 = t;
    t2.upsert(&rows([1], 9)).unwrap();
    let TaskState::Runs(r) = t2.checkpoint_streamed(6).unwrap().into() else {
        panic!("a table with runs leaves its capture as runs");
    };
    let both = snap(Some(r.to_capture().unwrap()), Some(r));
    let err = by_runs.task_snapshot(6, both).unwrap_err().to_string();
    assert!(err.contains("twice, as a capture and as runs"), "{err}");
    // Both kinds went through the runs: the full and the diffs on it.
    assert!(as_runs.contains(&StateKind::Full), "{as_runs:?}");
    assert!(
        as_runs.contains(&StateKind::Diff { base: 1 }),
        "{as_runs:?}"
    );
}
