//! Durable checkpoints and recovery: restarts and resume from a
//! `SnapshotStore` give the failure-free result under every protocol; diffs
//! on disk; the exactly-once Arrow file sink; corrupt checkpoints; failed
//! checkpoint writes; restoring into another shape.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::RecordBatch;
use snapcut_core::graph::{LogicalGraph, Partitioning};
use snapcut_core::operator::{Batch, Emitter, Operator};
use snapcut_core::protocol::{CheckpointId, InputId, ProtocolKind};
use snapcut_core::runtime::ops::{
    collect_sink, dwell_record, dwell_source, ipc_file_sink, keyed_aggregate, AggSpec, Collected,
};
use snapcut_core::runtime::{
    run_durable, CheckpointConfig, DurableOptions, JobOptions, RestartStrategy,
};
use snapcut_core::store::{FileKind, FileRole, SnapshotReader, SnapshotStore, StoreOptions};

// More users than an interval touches, so captures are diffs (a capture of
// every key is stored full).
const USERS: u64 = 20_000;
const COUNT: u64 = 60_000;
const BATCH: usize = 100;

/// Passes batches through slowly; fails once (shared `armed` flag) on the
/// first batch after it has seen a checkpoint commit, so that a restart
/// always has a checkpoint to go back to.
struct FailOnce {
    armed: Arc<AtomicBool>,
    committed: bool,
}

impl Operator for FailOnce {
    fn process(
        &mut self,
        _i: InputId,
        batch: Batch,
        out: &mut dyn Emitter,
    ) -> snapcut_core::Result<()> {
        std::thread::sleep(Duration::from_millis(1));
        if self.committed && self.armed.swap(false, Ordering::SeqCst) {
            return Err(snapcut_core::Error::Task("injected failure".into()));
        }
        out.emit(batch)
    }
    fn commit(&mut self, _id: CheckpointId) -> snapcut_core::Result<()> {
        self.committed = true;
        Ok(())
    }
}

fn graph(armed: Arc<AtomicBool>, par: usize, file_out: Option<&Path>) -> (LogicalGraph, Collected) {
    let mut g = LogicalGraph::new();
    let src = g.add_source("src", 2, dwell_source(COUNT, USERS, 7, BATCH).unwrap());
    let fail = g.add_operator(
        "fail",
        2,
        Arc::new(
            move |_: usize, _: usize| -> snapcut_core::Result<Box<dyn Operator>> {
                Ok(Box::new(FailOnce {
                    armed: armed.clone(),
                    committed: false,
                }))
            },
        ),
    );
    let agg = g.add_operator(
        "agg",
        par,
        keyed_aggregate(
            "user",
            vec![
                AggSpec::count("dwell_ms", "n"),
                AggSpec::sum("dwell_ms", "total"),
            ],
        )
        .unwrap(),
    );
    let (sink, out) = collect_sink();
    let sink = g.add_operator("sink", 1, sink);
    g.connect(src, fail, Partitioning::Forward);
    g.connect(fail, agg, Partitioning::Hash { key: "user".into() });
    g.connect(agg, sink, Partitioning::RoundRobin);
    if let Some(dir) = file_out {
        let files = g.add_operator("files", 2, ipc_file_sink(dir).unwrap());
        g.connect(fail, files, Partitioning::Forward);
    }
    (g, out)
}

fn expected() -> BTreeMap<i64, (i64, i64)> {
    let mut m = BTreeMap::new();
    for i in 0..COUNT {
        let (u, d) = dwell_record(7, i, USERS);
        let e = m.entry(u).or_insert((0, 0));
        e.0 += 1;
        e.1 += d;
    }
    m
}

fn rows(batches: &[RecordBatch]) -> BTreeMap<i64, (i64, i64)> {
    let mut m = BTreeMap::new();
    for b in batches {
        let u = b
            .column_by_name("user")
            .unwrap()
            .as_primitive::<Int64Type>();
        let n = b.column_by_name("n").unwrap().as_primitive::<Int64Type>();
        let t = b
            .column_by_name("total")
            .unwrap()
            .as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            assert!(
                m.insert(u.value(i), (n.value(i), t.value(i))).is_none(),
                "duplicate user row"
            );
        }
    }
    m
}

fn config(protocol: ProtocolKind) -> CheckpointConfig {
    CheckpointConfig {
        protocol,
        interval: Some(Duration::from_millis(5)),
        // Time to make progress between checkpoints on a loaded machine
        // (sync checkpoints pause the sources while they run).
        min_pause: Duration::from_millis(5),
        full_every: 3,
        retained: 3,
        ..Default::default()
    }
}

fn durable(root: &Path, resume: bool) -> DurableOptions {
    DurableOptions {
        resume,
        ..DurableOptions::new(root)
    }
}

#[test]
fn restart_from_store_equals_failure_free_under_every_protocol() {
    for protocol in [
        ProtocolKind::Aligned,
        ProtocolKind::Unaligned,
        ProtocolKind::ChandyLamport,
        ProtocolKind::Sync,
        ProtocolKind::SyncCapture,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let armed = Arc::new(AtomicBool::new(true));
        let (g, out) = graph(armed.clone(), 2, None);
        let r = run_durable(
            g,
            config(protocol),
            opts_restarting(1),
            &durable(dir.path(), false),
            &mut |_| {},
        )
        .unwrap();
        assert!(
            !armed.load(Ordering::SeqCst),
            "{protocol:?}: the failure was injected"
        );
        assert_eq!(r.restarts.len(), 1, "{protocol:?}");
        assert!(
            r.restarts[0].error.contains("injected failure"),
            "{:?}",
            r.restarts
        );
        assert!(
            r.restarts[0].restored_from.is_some(),
            "{protocol:?}: restarted from a checkpoint"
        );
        assert_eq!(rows(&out.batches()), expected(), "{protocol:?}");
    }
}

#[test]
fn failed_run_then_resume_equals_failure_free_and_files_are_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("chk");
    let files = dir.path().join("out");
    let armed = Arc::new(AtomicBool::new(true));
    let (g, _) = graph(armed.clone(), 2, Some(&files));
    let err = run_durable(
        g,
        config(ProtocolKind::Aligned),
        opts_restarting(0),
        &durable(&root, false),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    // Only committed files are visible, and they hold no more than was sent.
    let visible = read_visible(&files);
    assert!(
        visible.len() < COUNT as usize,
        "a failed run cannot have committed everything"
    );

    let (g, out) = graph(armed, 2, Some(&files));
    let r = run_durable(
        g,
        config(ProtocolKind::Aligned),
        opts_restarting(0),
        &durable(&root, true),
        &mut |_| {},
    )
    .unwrap();
    assert!(r.restored_from.is_some());
    assert_eq!(rows(&out.batches()), expected());
    let mut got = read_visible(&files);
    got.sort_unstable();
    let mut want: Vec<(i64, i64)> = (0..COUNT).map(|i| dwell_record(7, i, USERS)).collect();
    want.sort_unstable();
    assert_eq!(
        got, want,
        "no record lost or duplicated in the committed files"
    );
    let names: Vec<String> = std::fs::read_dir(&files)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with('.')),
        "stale staged files removed: {names:?}"
    );
}

/// Records of every committed (`*.arrow`, no leading dot) file.
fn read_visible(dir: &Path) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') || !name.ends_with(".arrow") {
            continue;
        }
        let reader =
            arrow_ipc::reader::FileReader::try_new(std::fs::File::open(&path).unwrap(), None)
                .unwrap();
        for b in reader {
            let b = b.unwrap();
            let u = b.column(0).as_primitive::<Int64Type>();
            let d = b.column(1).as_primitive::<Int64Type>();
            out.extend((0..b.num_rows()).map(|i| (u.value(i), d.value(i))));
        }
    }
    out
}

#[test]
fn incremental_diffs_on_disk_and_resume_from_a_chain() {
    let dir = tempfile::tempdir().unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let cfg = CheckpointConfig {
        retained: 100,
        final_checkpoint: false,
        ..config(ProtocolKind::Aligned)
    };
    let (g, first) = graph(armed.clone(), 2, None);
    run_durable(
        g,
        cfg.clone(),
        opts_restarting(0),
        &durable(dir.path(), false),
        &mut |_| {},
    )
    .unwrap();
    let reader = SnapshotReader::open(dir.path()).unwrap();
    let ids = reader.list().unwrap();
    let mut kinds = Vec::new();
    for &id in &ids {
        let m = reader.manifest(id).unwrap();
        for f in m
            .files
            .iter()
            .filter(|f| f.role == FileRole::State && f.vertex.as_deref() == Some("agg"))
        {
            kinds.push((id, f.kind, f.runs.last().map(|r| r.kind)));
        }
    }
    assert!(
        kinds.iter().any(|k| k.1 == Some(FileKind::Diff)),
        "{kinds:?}"
    );
    assert!(
        kinds.iter().any(|k| k.1 == Some(FileKind::Full)),
        "{kinds:?}"
    );
    // Every state is made of runs down to a full. How many depends on how
    // far the background compaction got (`store_tiers` tests the bound).
    assert!(
        kinds.iter().all(|k| k.2 == Some(FileKind::Full)),
        "{kinds:?}"
    );
    // Resume from the newest checkpoint (a diff chain if it is one): same result.
    let (g, out) = graph(armed, 2, None);
    let r = run_durable(
        g,
        cfg,
        opts_restarting(0),
        &durable(dir.path(), true),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(r.restored_from, ids.last().copied());
    assert_eq!(rows(&first.batches()), expected());
    assert_eq!(rows(&out.batches()), expected());
}

#[test]
fn corrupt_newest_checkpoint_falls_back_to_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let (g, _) = graph(armed.clone(), 2, None);
    run_durable(
        g,
        config(ProtocolKind::Aligned),
        opts_restarting(0),
        &durable(dir.path(), false),
        &mut |_| {},
    )
    .unwrap();
    let reader = SnapshotReader::open(dir.path()).unwrap();
    let ids = reader.list().unwrap();
    assert!(ids.len() >= 2, "retained 3: {ids:?}");
    let newest = *ids.last().unwrap();
    let m = reader.manifest(newest).unwrap();
    let f = m.files.iter().find(|f| f.role == FileRole::State).unwrap();
    crate::store_common::replace_file(&reader.checkpoint_dir(newest).join(&f.path), b"garbage");
    let (g, out) = graph(armed, 2, None);
    let r = run_durable(
        g,
        config(ProtocolKind::Aligned),
        opts_restarting(0),
        &durable(dir.path(), true),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(r.skipped.len(), 1, "{:?}", r.skipped);
    assert_eq!(r.skipped[0].id, newest);
    assert!(r.restored_from.is_some_and(|id| id < newest));
    assert_eq!(rows(&out.batches()), expected());
}

#[test]
fn failed_checkpoint_writes_count_against_tolerance_and_keep_older_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let (g, _) = graph(armed.clone(), 2, None);
    run_durable(
        g,
        config(ProtocolKind::Aligned),
        opts_restarting(0),
        &durable(dir.path(), false),
        &mut |_| {},
    )
    .unwrap();
    let reader = SnapshotReader::open(dir.path()).unwrap();
    let before = reader.list().unwrap();
    let manifests: Vec<Vec<u8>> = before
        .iter()
        .map(|&id| std::fs::read(reader.checkpoint_dir(id).join("manifest.json")).unwrap())
        .collect();
    let store = SnapshotStore::open(dir.path(), StoreOptions::default()).unwrap();
    let next = store.reader().next_checkpoint_id().unwrap();
    // A real write failure that holds for root too (no permissions to
    // drop): every directory the next checkpoints would write into is
    // already taken by a plain file, so creating it fails.
    for id in next..next + 100 {
        std::fs::write(reader.checkpoint_dir(id), b"in the way").unwrap();
    }
    let (g, _) = graph(armed, 2, None);
    let job = snapcut_core::runtime::Job::new(g, config(ProtocolKind::Aligned), opts())
        .unwrap()
        .first_checkpoint_id(next);
    let err = job.run(store).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, snapcut_core::Error::Snapshot(_)), "{msg}");
    assert!(
        msg.contains("could not be written")
            && msg.contains(&reader.checkpoint_dir(next).display().to_string())
            && msg.contains("tolerable_failures"),
        "{msg}"
    );
    assert_eq!(
        reader.list().unwrap(),
        before,
        "older checkpoints untouched"
    );
    for (id, manifest) in before.iter().zip(manifests) {
        reader.verify(*id).unwrap();
        let now = std::fs::read(reader.checkpoint_dir(*id).join("manifest.json")).unwrap();
        assert_eq!(now, manifest, "manifest of {id} unchanged");
    }
}

#[test]
fn unwritable_root_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let (g, _) = graph(Arc::new(AtomicBool::new(false)), 2, None);
    let err = run_durable(
        g,
        config(ProtocolKind::Aligned),
        opts_restarting(0),
        &durable(&file.join("chk"), false),
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("snapshot root") && err.contains("not-a-dir"),
        "{err}"
    );
}

#[test]
fn resume_with_another_parallelism_names_both_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let (g, _) = graph(armed.clone(), 2, None);
    run_durable(
        g,
        config(ProtocolKind::Aligned),
        opts_restarting(0),
        &durable(dir.path(), false),
        &mut |_| {},
    )
    .unwrap();
    let (g, _) = graph(armed, 3, None);
    let err = run_durable(
        g,
        config(ProtocolKind::Aligned),
        opts_restarting(0),
        &durable(dir.path(), true),
        &mut |_| {},
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, snapcut_core::Error::Snapshot(_)), "{msg}");
    assert!(msg.contains("agg x2") && msg.contains("agg x3"), "{msg}");
}

/// Short channels: barriers do not queue behind much slow data.
fn opts() -> JobOptions {
    opts_restarting(0)
}

/// [`opts`] with `attempts` immediate restarts.
fn opts_restarting(attempts: u32) -> JobOptions {
    JobOptions {
        channel_capacity: 2,
        restart: RestartStrategy {
            attempts,
            delay: Duration::ZERO,
        },
        ..Default::default()
    }
}
