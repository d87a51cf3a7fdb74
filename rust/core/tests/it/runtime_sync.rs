//! The synchronous baseline is faithful: under `sync` no record is processed
//! between the pause of the sources and the durable commit of the
//! checkpoint (files fsynced, manifest renamed into place), and every task
//! writes its whole state. The lighter `sync-capture` and ABS (`aligned`)
//! keep processing while the store writes — the same probe sees records go
//! by, which is what makes this test able to fail.
//!
//! The probe is a slow store: a `SnapshotSink` around the real
//! `SnapshotStore` whose `commit` sleeps before committing and reads a
//! counter of records processed by the first operator before and after.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use snapcut_core::graph::{LogicalGraph, Partitioning};
use snapcut_core::operator::{Batch, Emitter, Operator};
use snapcut_core::protocol::{CheckpointId, InputId, ProtocolKind};
use snapcut_core::runtime::ops::{collect_sink, dwell_source, keyed_aggregate, AggSpec};
use snapcut_core::runtime::{CheckpointConfig, Job, JobOptions, JobReport};
use snapcut_core::snapshot::{CheckpointMeta, CompletedCheckpoint, SnapshotSink, TaskSnapshot};
use snapcut_core::store::{FileKind, FileRole, SnapshotStore, StoreOptions, MANIFEST_FILE};

/// How long the probe's store takes to commit a checkpoint.
const SLOW_COMMIT: Duration = Duration::from_millis(120);
const RECORDS: u64 = 2_000_000;
// Ten times more users than records: nearly every record is a new key, so
// the table grows by what an interval changes, and once it holds more than
// one interval's records a capture changes under half of it: a diff (a
// capture of half the keys or more is stored full). With 500,000 users a
// slow machine's intervals (~450,000 records) touched half of them each time.
const USERS: u64 = 20_000_000;

/// Counts the records it passes on, and takes at least 50 µs per batch, so
/// that the job lasts long enough (≥ 0.2 s) for checkpoints to overlap it
/// however fast the machine.
struct Counting(Arc<AtomicU64>);

impl Operator for Counting {
    fn process(
        &mut self,
        _input: InputId,
        batch: Batch,
        out: &mut dyn Emitter,
    ) -> snapcut_core::Result<()> {
        std::thread::sleep(Duration::from_micros(50));
        self.0.fetch_add(batch.num_rows() as u64, Ordering::SeqCst);
        out.emit(batch)
    }
}

/// What the probe saw of one committed checkpoint.
#[derive(Debug, Clone)]
struct Window {
    id: CheckpointId,
    /// Records the counting operator had processed when it captured its state.
    at_capture: u64,
    /// ... when the coordinator began the commit, and after it returned.
    before: u64,
    after: u64,
    /// The manifest was on disk when `commit` returned.
    durable: bool,
    /// Every state file of the checkpoint is a full capture.
    all_full: bool,
    source_offset: u64,
}

struct SlowStore {
    inner: Arc<SnapshotStore>,
    processed: Arc<AtomicU64>,
    at_capture: Mutex<BTreeMap<CheckpointId, u64>>,
    windows: Mutex<Vec<Window>>,
}

impl SnapshotSink for SlowStore {
    fn task_snapshot(&self, id: CheckpointId, snapshot: TaskSnapshot) -> snapcut_core::Result<()> {
        if snapshot.task.vertex == "count" {
            self.at_capture
                .lock()
                .unwrap()
                .insert(id, self.processed.load(Ordering::SeqCst));
        }
        self.inner.task_snapshot(id, snapshot)
    }

    fn commit(&self, meta: CheckpointMeta) -> snapcut_core::Result<()> {
        let id = meta.id;
        let before = self.processed.load(Ordering::SeqCst);
        std::thread::sleep(SLOW_COMMIT);
        self.inner.commit(meta)?;
        let dir = self.inner.reader().checkpoint_dir(id);
        let durable = dir.join(MANIFEST_FILE).exists();
        let after = self.processed.load(Ordering::SeqCst);
        let manifest = self.inner.reader().manifest(id)?;
        let all_full = manifest
            .files
            .iter()
            .filter(|f| f.role == FileRole::State)
            .all(|f| f.kind == Some(FileKind::Full));
        let source_offset = manifest.tasks.iter().filter_map(|t| t.source_offset).sum();
        let at_capture = self
            .at_capture
            .lock()
            .unwrap()
            .get(&id)
            .copied()
            .unwrap_or(u64::MAX);
        self.windows.lock().unwrap().push(Window {
            id,
            at_capture,
            before,
            after,
            durable,
            all_full,
            source_offset,
        });
        Ok(())
    }

    fn abort(&self, id: CheckpointId) -> snapcut_core::Result<()> {
        self.inner.abort(id)
    }

    fn latest_completed(&self) -> snapcut_core::Result<Option<CompletedCheckpoint>> {
        self.inner.latest_completed()
    }

    fn materializes(&self) -> bool {
        self.inner.materializes()
    }
}

fn run(protocol: ProtocolKind, root: &Path) -> (JobReport, Vec<Window>, u64) {
    let processed = Arc::new(AtomicU64::new(0));
    let mut g = LogicalGraph::new();
    let src = g.add_source("src", 1, dwell_source(RECORDS, USERS, 3, 512).unwrap());
    let p = processed.clone();
    let count = g.add_operator(
        "count",
        1,
        Arc::new(
            move |_: usize, _: usize| -> snapcut_core::Result<Box<dyn Operator>> {
                Ok(Box::new(Counting(p.clone())))
            },
        ),
    );
    let agg = g.add_operator(
        "agg",
        2,
        keyed_aggregate("user", vec![AggSpec::count("dwell_ms", "n")]).unwrap(),
    );
    let (sink, results) = collect_sink();
    let out = g.add_operator("out", 1, sink);
    g.connect(src, count, Partitioning::Forward);
    g.connect(count, agg, Partitioning::Hash { key: "user".into() });
    g.connect(agg, out, Partitioning::RoundRobin);

    let store = SnapshotStore::open(
        root,
        StoreOptions {
            retain: 2,
            materialize_every: Some(4),
            ..Default::default()
        },
    )
    .unwrap();
    let probe = Arc::new(SlowStore {
        inner: store,
        processed: processed.clone(),
        at_capture: Mutex::new(BTreeMap::new()),
        windows: Mutex::new(Vec::new()),
    });
    let config = CheckpointConfig {
        protocol,
        interval: Some(Duration::from_millis(30)),
        // Some processing between stop-the-world checkpoints.
        min_pause: Duration::from_millis(30),
        full_every: 10,
        ..Default::default()
    };
    let report = Job::new(g, config, JobOptions::default())
        .unwrap()
        .run(probe.clone())
        .unwrap();
    let total: u64 = {
        use arrow_array::cast::AsArray;
        use arrow_array::types::Int64Type;
        results
            .batches()
            .iter()
            .flat_map(|b| {
                b.column_by_name("n")
                    .unwrap()
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            })
            .map(|n| n as u64)
            .sum()
    };
    let windows = probe.windows.lock().unwrap().clone();
    (report, windows, total)
}

#[test]
fn sync_processes_nothing_between_the_pause_and_the_durable_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (report, windows, total) = run(ProtocolKind::Sync, dir.path());
    assert_eq!(report.records_in, RECORDS);
    assert_eq!(total, RECORDS, "every record counted once");
    assert!(
        windows.len() >= 2,
        "expected periodic checkpoints besides the final one: {windows:?}"
    );
    for w in &windows {
        assert!(w.durable, "checkpoint {} not on disk when committed", w.id);
        assert!(w.all_full, "sync checkpoint {} wrote a state diff", w.id);
        // The first operator captured its state once the paused source's
        // barrier reached it: everything before the barrier, nothing after.
        assert_eq!(w.at_capture, w.source_offset, "{w:?}");
        assert_eq!(
            (w.at_capture, w.before, w.after),
            (w.at_capture, w.at_capture, w.at_capture),
            "records were processed between the pause and the durable commit of checkpoint {}: {w:?}",
            w.id
        );
    }
    // The pauses show in the throughput timeline: empty buckets between
    // the first and the last busy one of the source.
    let src = &report
        .timeline
        .iter()
        .find(|(v, _)| v == "src")
        .expect("source timeline")
        .1;
    assert_eq!(src.iter().sum::<u64>(), RECORDS);
    let first = src.iter().position(|&n| n > 0).unwrap();
    let last = src.iter().rposition(|&n| n > 0).unwrap();
    assert!(
        src[first..=last].contains(&0),
        "a {SLOW_COMMIT:?} pause per checkpoint should leave empty 50 ms buckets: {src:?}"
    );
}

#[test]
fn sync_capture_and_aligned_keep_processing_while_the_store_writes() {
    for protocol in [ProtocolKind::SyncCapture, ProtocolKind::Aligned] {
        let dir = tempfile::tempdir().unwrap();
        let (report, windows, total) = run(protocol, dir.path());
        assert_eq!(report.records_in, RECORDS, "{protocol}");
        assert_eq!(total, RECORDS, "{protocol}");
        assert!(windows.iter().all(|w| w.durable), "{protocol}: {windows:?}");
        assert!(
            windows.iter().any(|w| w.after > w.before),
            "{protocol}: no record was processed during any {SLOW_COMMIT:?} commit: {windows:?}"
        );
        // Incremental: after the first full capture, diffs.
        assert!(
            windows.iter().any(|w| !w.all_full),
            "{protocol}: every checkpoint was a full capture: {windows:?}"
        );
    }
}
