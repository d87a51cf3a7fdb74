//! Every corruption is detected with a clear `Error::Snapshot`, and
//! `latest_intact` falls back to the newest intact checkpoint, saying why.

use crate::store_common;

use std::fs;
use std::path::{Path, PathBuf};

use snapcut_core::store::{
    SnapshotReader, SnapshotStore, StoreOptions, FORMAT_VERSION, MANIFEST_FILE,
};
use snapcut_core::Error;
use store_common::*;

/// Checkpoints 1 (full), 2 and 3 (diffs) in a fresh root.
fn three(dir: &Path) -> SnapshotReader {
    let store = SnapshotStore::open(
        dir,
        StoreOptions {
            retain: 10,
            ..Default::default()
        },
    )
    .unwrap();
    let mut t = table(10);
    for id in 1..=3u64 {
        t.upsert(&rows((id as i64 * 10)..(id as i64 * 10 + 100), 1))
            .unwrap();
        checkpoint(&store, &mut t, id, false);
    }
    SnapshotReader::open(dir).unwrap()
}

fn state_file(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("chk-{id:08}")).join("agg-0.state.arrow")
}

fn snapshot_err(r: snapcut_core::Result<impl std::fmt::Debug>) -> String {
    match r {
        Err(Error::Snapshot(msg)) => msg,
        other => panic!("expected Error::Snapshot, got {other:?}"),
    }
}

#[test]
fn intact_root_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let r = three(dir.path());
    for id in 1..=3 {
        r.verify(id).unwrap();
    }
    let (m, skipped) = r.latest_intact().unwrap();
    assert_eq!(m.checkpoint_id, 3);
    assert!(skipped.is_empty());
}

#[test]
fn missing_manifest_is_partial() {
    let dir = tempfile::tempdir().unwrap();
    let r = three(dir.path());
    fs::remove_file(dir.path().join("chk-00000003").join(MANIFEST_FILE)).unwrap();
    let msg = snapshot_err(r.verify(3));
    assert!(
        msg.contains("no manifest.json") && msg.contains("partial"),
        "{msg}"
    );
    assert_eq!(r.list().unwrap(), vec![1, 2]);
    assert_eq!(r.partial().unwrap(), vec![3]);
    let (m, skipped) = r.latest_intact().unwrap();
    assert_eq!(m.checkpoint_id, 2);
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].id, 3);
    assert!(skipped[0].reason.contains("partial"));
}

#[test]
fn crash_between_files_and_manifest_is_not_complete_and_is_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    three(dir.path());
    // Simulate a crash after the data files were written, before the manifest.
    let partial = dir.path().join("chk-00000004");
    fs::create_dir(&partial).unwrap();
    fs::copy(state_file(dir.path(), 3), partial.join("agg-0.state.arrow")).unwrap();
    fs::write(partial.join("manifest.json.tmp"), b"{\"format_version\": 1").unwrap();
    let r = SnapshotReader::open(dir.path()).unwrap();
    assert_eq!(r.list().unwrap(), vec![1, 2, 3]);
    assert_eq!(r.latest_intact().unwrap().0.checkpoint_id, 3);
    assert_eq!(r.next_checkpoint_id().unwrap(), 5);
    let store = SnapshotStore::open(
        dir.path(),
        StoreOptions {
            retain: 10,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!partial.exists(), "partial checkpoint not cleaned on open");
    assert_eq!(store.completed(), vec![1, 2, 3]);
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let r = three(dir.path());
    fs::remove_file(dir.path().join("chk-00000003").join("sources.arrow")).unwrap();
    let msg = snapshot_err(r.verify(3));
    assert!(
        msg.contains("sources.arrow") && msg.contains("missing"),
        "{msg}"
    );
    let (m, skipped) = r.latest_intact().unwrap();
    assert_eq!((m.checkpoint_id, skipped[0].id), (2, 3));
}

#[test]
fn checksum_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let r = three(dir.path());
    let path = state_file(dir.path(), 3);
    let mut bytes = fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    replace_file(&path, bytes);
    let msg = snapshot_err(r.verify(3));
    assert!(msg.contains("checksum") && msg.contains("corrupt"), "{msg}");
    // Reading the state goes through the same check: never silently read.
    let msg = snapshot_err(r.state(3, &task("agg", 0)));
    assert!(msg.contains("checksum"), "{msg}");
}

#[test]
fn truncated_file() {
    let dir = tempfile::tempdir().unwrap();
    let r = three(dir.path());
    let path = state_file(dir.path(), 3);
    let bytes = fs::read(&path).unwrap();
    replace_file(&path, &bytes[..bytes.len() - 7]);
    let msg = snapshot_err(r.verify(3));
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn newer_format_version() {
    let dir = tempfile::tempdir().unwrap();
    let r = three(dir.path());
    let path = dir.path().join("chk-00000003").join(MANIFEST_FILE);
    let text = fs::read_to_string(&path).unwrap().replace(
        &format!("\"format_version\": {FORMAT_VERSION}"),
        "\"format_version\": 99",
    );
    replace_file(&path, text);
    let msg = snapshot_err(r.verify(3));
    assert!(
        msg.contains("format_version 99") && msg.contains("upgrade snapcut"),
        "{msg}"
    );
}

#[test]
fn garbage_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let r = three(dir.path());
    fs::write(
        dir.path().join("chk-00000003").join(MANIFEST_FILE),
        b"{not json",
    )
    .unwrap();
    let msg = snapshot_err(r.verify(3));
    assert!(msg.contains("not valid JSON"), "{msg}");
}

#[test]
fn corrupt_base_breaks_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let r = three(dir.path());
    // 3 is a diff on 2 on 1 (full): corrupting 1's state file spoils 2 and 3.
    let path = state_file(dir.path(), 1);
    let mut bytes = fs::read(&path).unwrap();
    bytes[100] ^= 0x01;
    replace_file(&path, bytes);
    let msg = snapshot_err(r.verify(3));
    assert!(msg.contains("needs base checkpoint 1"), "{msg}");
    let msg = snapshot_err(r.latest_intact());
    assert!(
        msg.contains("no intact checkpoint") && msg.contains("skipped 3"),
        "{msg}"
    );
}

#[test]
fn missing_checkpoint_and_root() {
    let dir = tempfile::tempdir().unwrap();
    let r = three(dir.path());
    let msg = snapshot_err(r.manifest(42));
    assert!(msg.contains("checkpoint 42 does not exist"), "{msg}");
    let msg = snapshot_err(SnapshotReader::open(dir.path().join("nope")));
    assert!(msg.contains("does not exist"), "{msg}");
}
