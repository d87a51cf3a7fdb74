//! [`SnapshotStore`]: the durable [`SnapshotSink`]. Task snapshots are staged
//! and written by the background writer; `commit` waits for them, lists
//! each state's runs (adopting what the compactor merged since), writes
//! `sources.arrow`, then the manifest by atomic rename, then applies
//! retention and hands the compactor the runs that grew too many.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow_schema::Schema;
use serde_json::Value;

use super::compactor::{CompactionBudget, CompactionHold, Compactor, Job};
use super::files::{write_atomic, write_ipc, Fsync, FsyncMode};
use super::format::{self, InProgress, ManifestMeta, Written};
use super::manifest::{
    FileEntry, FileRole, Manifest, TaskEntry, HELD_FILE, HELD_TMP_FILE, MANIFEST_FILE,
    MANIFEST_TMP_FILE, SOURCES_FILE,
};
use super::reader::SnapshotReader;
use super::writer::{Rows, Stored, Writer};
use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::snapshot::{
    CheckpointMeta, CompactionStats, CompletedCheckpoint, SnapshotSink, StateKind, StoreMetrics,
    TaskSnapshot,
};
use crate::state::KEY_METADATA;

/// Retention and housekeeping settings of a [`SnapshotStore`].
#[derive(Clone, Debug, PartialEq)]
pub struct StoreOptions {
    /// Completed checkpoints kept (savepoints and bases still needed by a kept
    /// checkpoint's diff chain are kept in addition). At least 1.
    pub retain: usize,
    /// Remove partial checkpoint directories (no manifest) when opening.
    pub cleanup_partial_on_open: bool,
    /// Bound the runs a task's state is made of: once this many diffs sit
    /// on its full, a background thread merges them (the newest
    /// `max(n, 2)` into one, or every run into a new full once the diffs
    /// hold more than a quarter of the full's rows), and a later commit
    /// names the merged run instead of them. The tables can then send only
    /// diffs (their `full_every` set high), so no task ever stalls for an
    /// O(state) full capture, and no commit waits for a merge either.
    /// `None`: keep whatever the tables send, no compaction.
    pub materialize_every: Option<usize>,
    /// A pause before each compaction, leaving the cores to the tasks
    /// (with `materialize_every`). Zero: compact as soon as planned.
    pub compaction_pause: Duration,
    /// How much of the machine the compactor may take (with
    /// `materialize_every`): [`CompactionBudget`]. Default: unbounded.
    pub compaction: CompactionBudget,
    /// How a checkpoint is made durable before its manifest counts: with
    /// `PerFile` or `Syncfs` a completed checkpoint survives an OS crash or
    /// power loss; with `Off` only the process being killed.
    pub fsync: FsyncMode,
    /// Sort every state file by its key on the writer thread (off the task
    /// thread), so each is a sorted run a restart maps as it is
    /// (`SnapshotReader::load_runs`, `StateTable::restore_mapped`). The
    /// runtime sets it for a job whose keyed state has a memory budget;
    /// otherwise state files keep their capture's row order (a restore
    /// rebuilds them in memory anyway, and sorting millions of rows each
    /// checkpoint costs CPU the job would feel).
    pub sort_state_files: bool,
    /// Write the checkpoint's files with direct I/O (`O_DIRECT`) where the
    /// root's filesystem takes it, so they do not pass through the page
    /// cache ([`super::direct`]); elsewhere, or with `false`, through it.
    /// The files are the same bytes either way.
    pub direct_io: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            retain: 3,
            cleanup_partial_on_open: true,
            materialize_every: None,
            compaction_pause: Duration::ZERO,
            compaction: CompactionBudget::UNBOUNDED,
            fsync: FsyncMode::default(),
            sort_state_files: false,
            direct_io: true,
        }
    }
}

/// A file staged for a checkpoint: its entry (sizes to come), when it is
/// written, and for a state file the key range of its rows.
struct StagedFile {
    entry: FileEntry,
    done: Receiver<Result<Stored>>,
    key_range: Option<(Value, Value)>,
}

/// What a checkpoint has staged so far.
#[derive(Default)]
struct Staged {
    tasks: Vec<TaskEntry>,
    files: Vec<StagedFile>,
}

/// Durable snapshot store on a local directory: one writer per root.
pub struct SnapshotStore {
    reader: SnapshotReader,
    options: StoreOptions,
    fsync: Arc<Fsync>,
    writer: Writer,
    staged: Mutex<BTreeMap<CheckpointId, Staged>>,
    /// Manifests of the completed checkpoints still on disk; the lock also
    /// serialises commits.
    committed: Mutex<BTreeMap<CheckpointId, Manifest>>,
    /// Completed checkpoints this store has removed or held (retention).
    dropped: Mutex<BTreeSet<CheckpointId>>,
    /// Held directories: the files each holds (`format::retention`).
    held: Mutex<BTreeMap<CheckpointId, BTreeSet<String>>>,
    /// With `materialize_every`: merges runs in the background.
    compactor: Option<Compactor>,
}

impl std::fmt::Debug for SnapshotStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotStore")
            .field("root", &self.reader.root())
            .field("options", &self.options)
            .finish()
    }
}

impl SnapshotStore {
    /// Opens (creating if needed) the snapshot root `root`.
    pub fn open(root: impl Into<PathBuf>, options: StoreOptions) -> Result<Arc<Self>> {
        let root: PathBuf = root.into();
        if options.retain == 0 {
            return Err(Error::Config(
                "store retain must be at least 1 completed checkpoint".into(),
            ));
        }
        options.compaction.validate()?;
        fs::create_dir_all(&root)
            .map_err(|e| Error::io(format!("creating snapshot root {}", root.display()), e))?;
        let reader = SnapshotReader::open(&root)?;
        let mut committed = BTreeMap::new();
        for id in reader.list()? {
            // An unreadable manifest is not a base anyone can build on.
            if let Ok(m) = reader.manifest(id) {
                committed.insert(id, m);
            }
        }
        // Every file there, so that what a crash left beside the held
        // files goes at the next retention.
        let held = reader.held()?;
        let fsync = Arc::new(Fsync::new(options.fsync).with_direct_io(options.direct_io));
        let compactor = match options.materialize_every {
            Some(_) => Some(Compactor::start(
                root.clone(),
                Arc::clone(&fsync),
                options.compaction_pause,
                options.compaction,
            )?),
            None => None,
        };
        let store = Self {
            reader,
            options,
            writer: Writer::start(Arc::clone(&fsync))?,
            fsync,
            staged: Mutex::new(BTreeMap::new()),
            committed: Mutex::new(committed),
            dropped: Mutex::new(BTreeSet::new()),
            held: Mutex::new(held),
            compactor,
        };
        if store.options.cleanup_partial_on_open {
            store.cleanup_partial(CheckpointId::MAX)?;
        }
        Ok(Arc::new(store))
    }

    /// Read access to the same root.
    pub fn reader(&self) -> &SnapshotReader {
        &self.reader
    }

    pub fn root(&self) -> &Path {
        self.reader.root()
    }

    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// Sync calls this store has made (0 with `FsyncMode::Off`).
    pub fn fsync_calls(&self) -> u64 {
        self.fsync.calls()
    }

    /// The fsync mode in effect (`StoreOptions::fsync`, or `PerFile` where
    /// `Syncfs` is not available).
    pub fn fsync_mode(&self) -> FsyncMode {
        self.fsync.mode()
    }

    /// What the background compaction has done (all zero without
    /// `materialize_every`).
    pub fn compaction_stats(&self) -> CompactionStats {
        self.compactor
            .as_ref()
            .map(Compactor::stats)
            .unwrap_or_default()
    }

    /// Waits, at most `timeout`, until every compaction handed over is done
    /// (its output waiting for the next commit to adopt it); true if so.
    /// For tests and tools: a commit never waits for compactions.
    pub fn wait_for_compactions(&self, timeout: Duration) -> bool {
        self.compactor.as_ref().is_none_or(|c| c.wait_idle(timeout))
    }

    /// Keeps the background compaction from merging anything while the
    /// returned hold lives (at most [`COMPACTION_HOLD_TIMEOUT`]): jobs are
    /// still handed over and their inputs kept, commits go on, nothing is
    /// merged or adopted. For tests and tools, to see a compaction in
    /// flight without depending on its speed. `None` without
    /// `materialize_every`.
    ///
    /// [`COMPACTION_HOLD_TIMEOUT`]: super::COMPACTION_HOLD_TIMEOUT
    pub fn hold_compactions(&self) -> Option<CompactionHold> {
        self.compactor.as_ref().map(Compactor::hold)
    }

    /// Ids of the completed checkpoints this store holds, oldest first.
    pub fn completed(&self) -> Vec<CheckpointId> {
        self.committed
            .lock()
            .expect("store poisoned")
            .keys()
            .copied()
            .collect()
    }

    /// Removes partial checkpoint directories below `below` that nothing is
    /// staging (leftovers of crashes or failed commits). Returns their ids.
    pub fn cleanup_partial(&self, below: CheckpointId) -> Result<Vec<CheckpointId>> {
        let staged: BTreeSet<CheckpointId> = self
            .staged
            .lock()
            .expect("store poisoned")
            .keys()
            .copied()
            .collect();
        let mut removed = Vec::new();
        for id in self.reader.partial()? {
            if id < below && !staged.contains(&id) {
                remove_dir(&self.reader.checkpoint_dir(id))?;
                removed.push(id);
            }
        }
        Ok(removed)
    }

    fn stage(&self, id: CheckpointId, snapshot: TaskSnapshot) -> Result<()> {
        let dir = self.reader.checkpoint_dir(id);
        let task = snapshot.task;
        let mut files = Vec::new();
        // A capture in memory, or a spilling table's runs, which the writer
        // merges into the file as it writes it (and reads its key range back).
        let state = match (snapshot.state, snapshot.state_runs) {
            (Some(c), None) => Some((c.kind, c.batch.schema(), Rows::Batches(vec![c.batch]))),
            (None, Some(r)) => {
                let base = r.kind == StateKind::Full;
                let rows = Rows::Runs { runs: r.runs, base };
                Some((r.kind, r.schema, rows))
            }
            (None, None) => None,
            (Some(_), Some(_)) => {
                return Err(Error::Snapshot(format!(
                    "task {task} reported its state for checkpoint {id} twice, as a capture \
                     and as runs; a task reports one of them"
                )))
            }
        };
        if let Some((kind, schema, rows)) = state {
            let base = match kind {
                StateKind::Full => None,
                StateKind::Diff { base } => Some(base),
            };
            let key = schema.metadata().get(KEY_METADATA).cloned();
            // O(rows of the capture), as the capture itself.
            let key_range = match &rows {
                Rows::Batches(b) => key.as_deref().and_then(|k| format::key_range(&b[0], k)),
                Rows::Runs { .. } => None,
            };
            let entry = format::state_entry(&task, key.clone(), base, UNWRITTEN);
            let done = self.writer.submit(
                dir.clone(),
                entry.path.clone(),
                schema,
                rows,
                key.clone().filter(|_| self.options.sort_state_files),
                key.filter(|_| base.is_some()),
            );
            files.push(StagedFile {
                entry,
                done,
                key_range,
            });
        }
        for log in snapshot.channels {
            let schema = match log.records.first() {
                Some(b) => b.schema(),
                None => Arc::new(Schema::empty()),
            };
            if let Some(bad) = log.records.iter().find(|b| b.schema() != schema) {
                return Err(Error::Snapshot(format!(
                    "channel '{}' of task {task} logged batches of different schemas ({} vs {})",
                    log.edge,
                    bad.schema(),
                    schema
                )));
            }
            let entry =
                format::channel_entry(&task, &log.edge, log.input, log.from_subtask, UNWRITTEN);
            let done = self.writer.submit(
                dir.clone(),
                entry.path.clone(),
                schema,
                Rows::Batches(log.records),
                None,
                None,
            );
            files.push(StagedFile {
                entry,
                done,
                key_range: None,
            });
        }
        let mut staged = self.staged.lock().expect("store poisoned");
        let st = staged.entry(id).or_default();
        if st
            .tasks
            .iter()
            .any(|t| t.vertex == task.vertex && t.subtask == task.subtask)
        {
            return Err(Error::Snapshot(format!(
                "task {task} reported twice for checkpoint {id}; each task reports once"
            )));
        }
        st.tasks.push(TaskEntry {
            vertex: task.vertex.clone(),
            subtask: task.subtask,
            source_offset: snapshot.source_offset,
            alignment_nanos: snapshot.alignment_nanos,
            sent_seq: snapshot.sent_seq,
            taken_seq: snapshot.taken_seq,
        });
        st.files.extend(files);
        Ok(())
    }

    fn finish(
        &self,
        meta: &CheckpointMeta,
        staged: Staged,
        committed: &BTreeMap<CheckpointId, Manifest>,
    ) -> Result<Manifest> {
        let id = meta.id;
        let dir = self.reader.checkpoint_dir(id);
        let mut files = Vec::with_capacity(staged.files.len() + 1);
        let mut key_ranges = BTreeMap::new();
        let mut first_err = None;
        for StagedFile {
            mut entry,
            done,
            key_range,
        } in staged.files
        {
            match done
                .recv()
                .unwrap_or_else(|_| Err(Error::Snapshot("snapshot writer thread died".into())))
            {
                Ok(stored) => {
                    let w = stored.written;
                    entry.rows = w.rows;
                    entry.bytes = w.bytes;
                    entry.crc32c = w.crc32c;
                    entry.filter = stored.filter;
                    entry.times = stored.times;
                    if let Some(range) = key_range.or(stored.key_range) {
                        key_ranges.insert(entry.path.clone(), range);
                    }
                    files.push(entry);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        for f in files.iter_mut().filter(|f| f.role == FileRole::State) {
            let key_range = key_ranges.remove(&f.path);
            let base_runs = match f.base {
                None => None,
                Some(base) => {
                    let task = f.task().expect("state files name their task");
                    let base = self.resolve_base(id, base, &task, committed);
                    f.base = Some(base);
                    // Refuses a base whose chain is gone (a run's directory
                    // may be held).
                    let held = self.held.lock().expect("store poisoned");
                    format::diff_chain(id, &task, base, committed.get(&base), |c| {
                        committed.contains_key(&c) || held.contains_key(&c)
                    })?;
                    drop(held);
                    let base_entry = committed
                        .get(&base)
                        .and_then(|m| m.state_file(&task))
                        .expect("diff_chain found the base's state file");
                    Some(format::runs_of(base, &task, base_entry, |cid| {
                        committed.get(&cid).cloned().ok_or_else(|| {
                            Error::Snapshot(format!(
                                "checkpoint {id}: state of {task} needs checkpoint {cid}, \
                                 which is not committed"
                            ))
                        })
                    })?)
                }
            };
            f.runs = format::runs_after(id, f, key_range, base_runs.as_deref());
            f.chain = format::runs_chain(&f.runs);
        }
        let mut tasks = staged.tasks;
        tasks.sort_by(|a, b| (&a.vertex, a.subtask).cmp(&(&b.vertex, b.subtask)));
        fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        self.adopt_compactions(id, &dir, &mut files);
        files.push(self.write_sources(&dir, &tasks)?);
        let manifest = format::build_manifest(
            ManifestMeta {
                checkpoint_id: id,
                protocol: meta.protocol.name().into(),
                started_ms: meta.started_ms,
                finished_ms: meta.finished_ms,
                committed_ms: now_ms(),
                graph_fingerprint: meta.graph_fingerprint.clone(),
                savepoint: meta.savepoint,
                extra: Default::default(),
            },
            tasks,
            files,
        );
        let json = format::manifest_bytes(&manifest);
        crate::failpoint::hit("store.before_manifest");
        // One directory fsync, after the rename, makes the data files' entries
        // and the manifest's durable together. Should a crash keep the
        // manifest but lose a file, the reader finds the file missing and
        // skips the checkpoint, and the one before it is still there:
        // retention only runs once this returns.
        write_atomic(&dir, MANIFEST_FILE, MANIFEST_TMP_FILE, &json, &self.fsync)?;
        self.fsync.dir_before_barrier(self.root())?;
        crate::failpoint::hit("store.after_manifest");
        Ok(manifest)
    }

    /// The committed checkpoint a state diff of `task` at `id`, captured
    /// against `base`, is stored against. Normally `base`. But with several
    /// checkpoints in flight, retention may have removed `base` (a completed
    /// checkpoint), or a checkpoint in `base`'s chain for this task (`base`
    /// being kept only for another task's chain), after the diff was
    /// captured and before it was staged, because a newer completed
    /// checkpoint no longer needed it. The diff holds the current row of
    /// every key changed since `base`, a superset of those changed since any
    /// later checkpoint n < `id`: applied on top of n's state it gives the
    /// same state. So it is rebased onto the newest such n whose chain is
    /// whole. A `base` that never completed (was aborted) is returned as is,
    /// and refused by the caller.
    fn resolve_base(
        &self,
        id: CheckpointId,
        base: CheckpointId,
        task: &crate::snapshot::TaskId,
        committed: &BTreeMap<CheckpointId, Manifest>,
    ) -> CheckpointId {
        let held = self.held.lock().expect("store poisoned");
        // Every file the task's state there reads is still on disk.
        let whole = |m: &Manifest| {
            m.state_file(task).is_some_and(|f| {
                if f.runs.is_empty() {
                    f.chain.iter().all(|c| committed.contains_key(c))
                } else {
                    f.runs.iter().all(|r| {
                        committed.contains_key(&r.checkpoint)
                            || held.get(&r.checkpoint).is_some_and(|h| h.contains(&r.path))
                    })
                }
            })
        };
        let completed_once = committed.contains_key(&base)
            || self.dropped.lock().expect("store poisoned").contains(&base);
        if !completed_once || committed.get(&base).is_some_and(whole) {
            return base;
        }
        committed
            .range(base + 1..id)
            .rev()
            .find(|(_, m)| whole(m))
            .map_or(base, |(&n, _)| n)
    }

    /// Names in `files` (the state entries of checkpoint `id`, not yet
    /// visible) the runs the compactor merged since the last commit, each
    /// moved into `dir`, in place of the runs it merged; an output whose
    /// inputs are no longer among its task's runs is removed. Only renames:
    /// the merging happened on the compactor's thread.
    fn adopt_compactions(&self, id: CheckpointId, dir: &Path, files: &mut [FileEntry]) {
        let Some(compactor) = &self.compactor else {
            return;
        };
        for done in compactor.take_finished() {
            let output = format::merged_run(
                &done.plan,
                id,
                done.name.clone(),
                done.written,
                done.key_range.clone(),
                done.filter.clone(),
                done.times.clone(),
            );
            let entry = files
                .iter_mut()
                .find(|f| f.role == FileRole::State && f.task().as_ref() == Some(&done.task));
            let adopted = entry.and_then(|f| {
                let runs = format::adopt(&f.runs, &done.plan.inputs, output)?;
                // What is stored beside it first: a run file in place names it.
                if let Some(filter) = &done.filter {
                    fs::rename(done.staged_filter(filter), dir.join(&filter.path)).ok()?;
                }
                if let Some(times) = &done.times {
                    fs::rename(done.staged_times(times), dir.join(&times.path)).ok()?;
                }
                fs::rename(&done.staged, dir.join(&done.name)).ok()?;
                crate::failpoint::hit("compaction.adopted");
                f.runs = runs;
                f.chain = format::runs_chain(&f.runs);
                Some(())
            });
            if adopted.is_none() {
                let _ = fs::remove_file(&done.staged);
                if let Some(filter) = &done.filter {
                    let _ = fs::remove_file(done.staged_filter(filter));
                }
                if let Some(times) = &done.times {
                    let _ = fs::remove_file(done.staged_times(times));
                }
            }
            compactor.settled(&done, adopted.is_some());
        }
    }

    /// Hands the compactor the tasks of `manifest` whose runs call for a
    /// merge ([`format::plan_compaction`]); never waits.
    fn schedule_compactions(&self, manifest: &Manifest) {
        let (Some(compactor), Some(limit)) = (&self.compactor, self.options.materialize_every)
        else {
            return;
        };
        for (task, f) in format::state_files(manifest) {
            if let Some(plan) = format::plan_compaction(&f.runs, limit) {
                compactor.submit(Job {
                    task,
                    key: f.key.clone(),
                    plan,
                });
            }
        }
    }

    fn write_sources(&self, dir: &Path, tasks: &[TaskEntry]) -> Result<FileEntry> {
        let batch = format::sources_batch(tasks);
        let w = write_ipc(
            &dir.join(SOURCES_FILE),
            &batch.schema(),
            &[batch],
            &self.fsync,
        )?;
        Ok(format::sources_entry(w))
    }

    /// Applies the retention rule ([`format::retention`]): deletes the
    /// completed checkpoints beyond `retain` that are neither savepoints
    /// nor needed whole by a kept checkpoint nor a base of a diff still
    /// staged (with several checkpoints in flight, a diff is based on an
    /// older completed one); holds the directories of those whose runs a
    /// kept checkpoint or a compaction in flight reads (only those files
    /// stay), and releases held ones nothing reads any more. Returns the
    /// completed checkpoints removed or held.
    fn apply_retention(
        &self,
        committed: &mut BTreeMap<CheckpointId, Manifest>,
    ) -> Result<Vec<CheckpointId>> {
        let in_progress: Vec<InProgress> = self
            .staged
            .lock()
            .expect("store poisoned")
            .iter()
            .map(|(id, st)| InProgress {
                id: *id,
                bases: Some(st.files.iter().filter_map(|f| f.entry.base).collect()),
            })
            .collect();
        // A compaction reads its inputs' files: they stay until its output
        // is adopted or discarded.
        let reading = self
            .compactor
            .as_ref()
            .map(Compactor::needed)
            .unwrap_or_default();
        let mut held = self.held.lock().expect("store poisoned");
        let plan = format::retention(
            committed,
            &held,
            &in_progress,
            &reading,
            self.options.retain,
        );
        for (id, hold) in &plan.hold {
            let dir = self.reader.checkpoint_dir(*id);
            // The record first, durable, then the manifest goes: a crash
            // leaves the checkpoint complete or held, never partial.
            let record = format::held_record(
                *id,
                hold.files.iter().cloned(),
                hold.read_by.iter().copied(),
            );
            write_atomic(
                &dir,
                HELD_FILE,
                HELD_TMP_FILE,
                &format::held_bytes(&record),
                &self.fsync,
            )?;
            if hold.demote {
                crate::failpoint::hit("retention.held_record");
                remove_file(&dir.join(MANIFEST_FILE))?;
                committed.remove(id);
                self.dropped.lock().expect("store poisoned").insert(*id);
                crate::failpoint::hit("retention.mid_hold");
            }
            let listing_err = |e| Error::io(format!("listing {}", dir.display()), e);
            for entry in fs::read_dir(&dir).map_err(listing_err)? {
                let entry = entry.map_err(listing_err)?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name != HELD_FILE && !hold.files.contains(&name) {
                    remove_file(&entry.path())?;
                }
            }
            held.insert(*id, hold.files.clone());
        }
        for id in &plan.remove {
            let dir = self.reader.checkpoint_dir(*id);
            // Manifest first: a crash midway leaves a partial directory, which
            // is never listed as complete and is cleaned up later.
            remove_file(&dir.join(MANIFEST_FILE))?;
            remove_dir(&dir)?;
            committed.remove(id);
            self.dropped.lock().expect("store poisoned").insert(*id);
        }
        for id in &plan.release {
            let dir = self.reader.checkpoint_dir(*id);
            // Record first: what is left is partial, cleaned up later.
            remove_file(&dir.join(HELD_FILE))?;
            remove_dir(&dir)?;
            held.remove(id);
        }
        Ok(plan.removed())
    }

    /// The held directories (checkpoints removed whose runs newer ones
    /// read) and the files each holds.
    pub fn held(&self) -> BTreeMap<CheckpointId, BTreeSet<String>> {
        self.held.lock().expect("store poisoned").clone()
    }

    /// The files compactions in flight read (retention keeps them).
    pub fn compaction_inputs(&self) -> BTreeSet<(CheckpointId, String)> {
        self.compactor
            .as_ref()
            .map(Compactor::needed)
            .unwrap_or_default()
    }
}

impl SnapshotSink for SnapshotStore {
    fn task_snapshot(&self, id: CheckpointId, snapshot: TaskSnapshot) -> Result<()> {
        let on_disk = self.reader.checkpoint_dir(id).join(MANIFEST_FILE).exists();
        if on_disk
            || self
                .committed
                .lock()
                .expect("store poisoned")
                .contains_key(&id)
        {
            return Err(Error::Snapshot(format!(
                "checkpoint {id} is already committed under {}; refusing to overwrite it (use a new id)",
                self.root().display()
            )));
        }
        self.stage(id, snapshot)
    }

    fn commit(&self, meta: CheckpointMeta) -> Result<()> {
        let id = meta.id;
        let mut committed = self.committed.lock().expect("store poisoned");
        if committed.contains_key(&id)
            || self.reader.checkpoint_dir(id).join(MANIFEST_FILE).exists()
        {
            return Err(Error::Snapshot(format!(
                "checkpoint {id} is already committed under {}; refusing to overwrite it",
                self.root().display()
            )));
        }
        let staged = self
            .staged
            .lock()
            .expect("store poisoned")
            .remove(&id)
            .unwrap_or_default();
        match self.finish(&meta, staged, &committed) {
            Ok(manifest) => {
                self.schedule_compactions(&manifest);
                committed.insert(id, manifest);
            }
            Err(e) => {
                // Nothing half-written may look complete; older checkpoints stay.
                let _ = remove_dir(&self.reader.checkpoint_dir(id));
                return Err(e);
            }
        }
        self.apply_retention(&mut committed)?;
        drop(committed);
        self.cleanup_partial(id)?;
        Ok(())
    }

    fn latest_completed(&self) -> Result<Option<CompletedCheckpoint>> {
        Ok(self.reader.restore_point()?.0)
    }

    fn materializes(&self) -> bool {
        self.options.materialize_every.is_some()
    }

    fn store_metrics(&self, id: CheckpointId) -> Option<StoreMetrics> {
        let counts = {
            let committed = self.committed.lock().expect("store poisoned");
            format::run_counts(committed.get(&id)?)
        };
        Some(StoreMetrics {
            bytes_written: counts.files_bytes,
            runs_max: counts.runs_max,
            runs_total: counts.runs_total,
            debt_bytes: counts.debt_bytes,
            compaction: self.compaction_stats(),
        })
    }

    fn abort(&self, id: CheckpointId) -> Result<()> {
        let staged = self.staged.lock().expect("store poisoned").remove(&id);
        if let Some(staged) = staged {
            // Let queued writes land before deleting, or they would recreate files.
            for f in staged.files {
                let _ = f.done.recv();
            }
        }
        let dir = self.reader.checkpoint_dir(id);
        if dir.join(MANIFEST_FILE).exists() {
            return Err(Error::Snapshot(format!(
                "checkpoint {id} is already committed; abort leaves it in place"
            )));
        }
        remove_dir(&dir)
    }
}

/// The sizes of a file still being written (filled in at commit).
const UNWRITTEN: Written = Written {
    rows: 0,
    bytes: 0,
    crc32c: 0,
};

fn remove_file(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", path.display()), e)),
    }
}

fn remove_dir(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("removing {}", dir.display()), e)),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
