//! Reading a snapshot root: listing, verification, and rebuilding full state
//! from manifests alone (nearest full + following diffs).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_schema::Schema;

use super::files::{map_checked, read_checked};
use super::format::{self, decode_buffer, decode_ipc, DirState};
use super::manifest::{
    checkpoint_dir_name, parse_checkpoint_dir, FileEntry, FileKind, FilterEntry, Manifest,
    TimesEntry, HELD_FILE, MANIFEST_FILE,
};
use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::protocol::ProtocolKind;
use crate::snapshot::{
    ChannelLog, CheckpointMeta, CompletedCheckpoint, StateCapture, StateKind, TaskId, TaskSnapshot,
};
use crate::state::runs::BloomFilter;
use crate::state::{StatePolicy, StateTable, DELETED_COLUMN, KEY_METADATA};

/// A checkpoint passed over by [`SnapshotReader::latest_intact`], and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Skipped {
    pub id: CheckpointId,
    pub reason: String,
}

/// Files of a checkpoint mapped and checked, by (checkpoint, path).
type CheckedFiles = HashMap<(CheckpointId, String), Buffer>;

/// Read access to a snapshot root on the local filesystem.
#[derive(Clone, Debug)]
pub struct SnapshotReader {
    root: PathBuf,
}

impl SnapshotReader {
    /// Opens `root` for reading; it must be an existing directory.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        if !root.is_dir() {
            return Err(Error::Snapshot(format!(
                "snapshot root {} does not exist or is not a directory",
                root.display()
            )));
        }
        Ok(Self { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Directory of checkpoint `id`.
    pub fn checkpoint_dir(&self, id: CheckpointId) -> PathBuf {
        self.root.join(checkpoint_dir_name(id))
    }

    /// Every checkpoint directory and what it is ([`format::scan_listing`]
    /// of the root's entries and each checkpoint directory's manifest or
    /// held record).
    pub fn scan(&self) -> Result<BTreeMap<CheckpointId, DirState>> {
        let listing = self.listing(false)?;
        Ok(format::scan_listing(
            listing.iter().map(|(p, d)| (p.as_str(), *d)),
        ))
    }

    /// The root's entries, each checkpoint directory's manifest or held
    /// record, and with `held_contents` every file of a held directory.
    fn listing(&self, held_contents: bool) -> Result<Vec<(String, bool)>> {
        let listing_err = |e| Error::io(format!("listing {}", self.root.display()), e);
        let mut listing = Vec::new();
        for entry in fs::read_dir(&self.root).map_err(listing_err)? {
            let entry = entry.map_err(listing_err)?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let path = entry.path();
            let is_dir = path.is_dir();
            if is_dir && parse_checkpoint_dir(&name).is_some() {
                if path.join(MANIFEST_FILE).is_file() {
                    listing.push((format!("{name}/{MANIFEST_FILE}"), false));
                } else if path.join(HELD_FILE).is_file() {
                    listing.push((format!("{name}/{HELD_FILE}"), false));
                    if held_contents {
                        let dir_err = |e| Error::io(format!("listing {}", path.display()), e);
                        for file in fs::read_dir(&path).map_err(dir_err)? {
                            let file = file.map_err(dir_err)?;
                            if let Ok(f) = file.file_name().into_string() {
                                listing.push((format!("{name}/{f}"), file.path().is_dir()));
                            }
                        }
                    }
                }
            }
            listing.push((name, is_dir));
        }
        Ok(listing)
    }

    /// Ids of complete checkpoints (those with a manifest), oldest first.
    pub fn list(&self) -> Result<Vec<CheckpointId>> {
        self.ids(DirState::Complete)
    }

    /// Ids of partial checkpoint directories (no manifest nor held record:
    /// being written, crashed or aborted).
    pub fn partial(&self) -> Result<Vec<CheckpointId>> {
        self.ids(DirState::Partial)
    }

    /// The held directories (checkpoints retention removed whose runs newer
    /// ones read), each with the files it holds.
    pub fn held(&self) -> Result<BTreeMap<CheckpointId, BTreeSet<String>>> {
        let listing = self.listing(true)?;
        let entries = || listing.iter().map(|(p, d)| (p.as_str(), *d));
        Ok(format::held_files(
            entries(),
            &format::scan_listing(entries()),
        ))
    }

    /// Every checkpoint but the held ones: what a restore tries, newest
    /// first, or reports as skipped.
    fn restorable_or_partial(&self) -> Result<Vec<(CheckpointId, DirState)>> {
        Ok(self
            .scan()?
            .into_iter()
            .filter(|(_, s)| *s != DirState::Held)
            .collect())
    }

    fn ids(&self, state: DirState) -> Result<Vec<CheckpointId>> {
        Ok(self
            .scan()?
            .into_iter()
            .filter_map(|(id, s)| (s == state).then_some(id))
            .collect())
    }

    /// The manifest of checkpoint `id`.
    pub fn manifest(&self, id: CheckpointId) -> Result<Manifest> {
        let dir = self.checkpoint_dir(id);
        let path = dir.join(MANIFEST_FILE);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let found = match (dir.is_dir(), dir.join(HELD_FILE).is_file()) {
                    (false, _) => None,
                    (true, true) => Some(DirState::Held),
                    (true, false) => Some(DirState::Partial),
                };
                return Err(format::missing_manifest(
                    id,
                    &dir.display().to_string(),
                    &self.root.display().to_string(),
                    found,
                ));
            }
            Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
        };
        format::parse_manifest(&bytes, &format!("manifest {}", path.display()), id)
    }

    /// Checks checkpoint `id` completely: its manifest, every file's presence,
    /// size and checksum, and the base checkpoints its state diffs need. The
    /// files are checked through a mapping: a root's state larger than memory
    /// verifies without holding any file on the heap.
    pub fn verify(&self, id: CheckpointId) -> Result<Manifest> {
        self.verify_keeping(id, false).map(|(manifest, _)| manifest)
    }

    /// [`Self::verify`]; with `keep`, also the checked files' mappings by
    /// (checkpoint, path), so that a restore decodes them as they are rather
    /// than mapping and checksumming each file a second time.
    fn verify_keeping(&self, id: CheckpointId, keep: bool) -> Result<(Manifest, CheckedFiles)> {
        let manifest = self.manifest(id)?;
        let mut checked = CheckedFiles::new();
        format::verify_with(
            id,
            &manifest,
            |cid| self.manifest(cid),
            |cid, f| {
                let buffer = map_checked(&self.checkpoint_dir(cid), f, cid)?;
                if keep {
                    checked.insert((cid, f.path.clone()), buffer);
                }
                Ok(())
            },
        )?;
        Ok((manifest, checked))
    }

    /// The newest checkpoint that verifies, and every newer one skipped with
    /// the reason (partial, missing file, checksum, version, broken chain).
    pub fn latest_intact(&self) -> Result<(Manifest, Vec<Skipped>)> {
        let mut skipped = Vec::new();
        for (id, _) in self.restorable_or_partial()?.into_iter().rev() {
            match self.verify(id) {
                Ok(m) => return Ok((m, skipped)),
                Err(e) => skipped.push(Skipped {
                    id,
                    reason: e.to_string(),
                }),
            }
        }
        let why = skipped
            .iter()
            .map(|s| format!("{}: {}", s.id, s.reason))
            .collect::<Vec<_>>()
            .join("; ");
        Err(Error::Snapshot(format!(
            "no intact checkpoint under {}{}",
            self.root.display(),
            if why.is_empty() {
                String::new()
            } else {
                format!(" (skipped {why})")
            }
        )))
    }

    /// One past the highest checkpoint id present (complete or partial), so a
    /// restarted job never reuses an id.
    pub fn next_checkpoint_id(&self) -> Result<CheckpointId> {
        Ok(self.scan()?.keys().next_back().map_or(1, |id| id + 1))
    }

    /// Reads one checked file of checkpoint `id`.
    pub fn read_file(
        &self,
        id: CheckpointId,
        entry: &FileEntry,
    ) -> Result<(Arc<Schema>, Vec<RecordBatch>)> {
        let bytes = read_checked(&self.checkpoint_dir(id), entry, id)?;
        decode_ipc(bytes, &format!("checkpoint {id} file {}", entry.path))
    }

    /// The stored filter `entry` of a state file of checkpoint `id`, checked
    /// against its entry; a missing or corrupt one is an error naming it.
    pub fn read_filter(&self, id: CheckpointId, entry: &FilterEntry) -> Result<BloomFilter> {
        let dir = self.checkpoint_dir(id);
        let bytes = read_checked(&dir, &format::filter_file_entry(entry, None), id)?;
        format::read_filter(
            &bytes,
            entry,
            id,
            &dir.join(&entry.path).display().to_string(),
        )
    }

    /// The state captures that rebuild `task`'s state at checkpoint `id`:
    /// a full one then diffs up to `id` (empty if stateless), each with the
    /// checkpoint whose state it ends at: the runs its entry lists, or its
    /// chain (format 1), walked by [`format::state_links`].
    pub fn state_chain(
        &self,
        id: CheckpointId,
        task: &TaskId,
    ) -> Result<Vec<(CheckpointId, StateCapture)>> {
        self.links(id, task, false, &CheckedFiles::new(), true)
    }

    /// As [`Self::state_chain`], each file read through a read-only mapping
    /// (checked against its entry all the same) and decoded in place: the
    /// captures' arrays point into the files' pages, so opening a state
    /// costs page cache, not heap. What a lazy restore hands to operators
    /// that keep runs ([`crate::operator::Operator::restores_runs`]).
    pub fn state_runs(
        &self,
        id: CheckpointId,
        task: &TaskId,
    ) -> Result<Vec<(CheckpointId, StateCapture)>> {
        self.links(id, task, true, &CheckedFiles::new(), true)
    }

    /// The stored time index `entry` of a full state file of checkpoint
    /// `id` (format 5), checked against its entry (bytes, then columns and
    /// count); mapped if `mapped`. A missing or corrupt one is an error
    /// naming it.
    pub fn read_times(
        &self,
        id: CheckpointId,
        entry: &TimesEntry,
        mapped: bool,
    ) -> Result<RecordBatch> {
        let dir = self.checkpoint_dir(id);
        let file = format::times_file_entry(entry, None);
        let what = format!("checkpoint {id} file {}", entry.path);
        let (schema, batches) = if mapped {
            decode_buffer(map_checked(&dir, &file, id)?, &what)?
        } else {
            self.read_file(id, &file)?
        };
        let batch = format::concat(&schema, &batches)?;
        format::check_times(&batch, entry, &what)?;
        Ok(batch)
    }

    /// `checked`: files mapped and checked already (by [`Self::verify_keeping`]);
    /// `times`: a full's stored time index read too (format 5).
    fn links(
        &self,
        id: CheckpointId,
        task: &TaskId,
        mapped: bool,
        checked: &CheckedFiles,
        times: bool,
    ) -> Result<Vec<(CheckpointId, StateCapture)>> {
        let manifest = self.manifest(id)?;
        let Some(entry) = manifest.state_file(task) else {
            return Ok(Vec::new());
        };
        let links = format::state_links(id, task, entry, |cid| self.manifest(cid))?;
        let mut out = Vec::with_capacity(links.len());
        for link in links {
            let (schema, batches) = if mapped {
                let dir = self.checkpoint_dir(link.checkpoint);
                let what = format!("checkpoint {} file {}", link.checkpoint, link.entry.path);
                let buffer = match checked.get(&(link.checkpoint, link.entry.path.clone())) {
                    Some(buffer) => buffer.clone(),
                    None => map_checked(&dir, &link.entry, link.checkpoint)?,
                };
                decode_buffer(buffer, &what)?
            } else {
                self.read_file(link.checkpoint, &link.entry)?
            };
            let batch = format::concat(&schema, &batches)?;
            // A lazy restore makes runs of the captures: a diff's stored
            // filter spares hashing its keys again.
            let filter = match (&link.entry.filter, mapped) {
                (Some(f), true) => Some(Arc::new(self.read_filter(link.checkpoint, f)?)),
                _ => None,
            };
            let times = match (&link.entry.times, times) {
                (Some(t), true) => Some(self.read_times(link.checkpoint, t, mapped)?),
                _ => None,
            };
            out.push((
                link.state_at,
                StateCapture {
                    kind: link.kind,
                    batch,
                    filter,
                    times,
                },
            ));
        }
        Ok(out)
    }

    /// `task`'s full state at checkpoint `id`, rebuilt from its chain
    /// ([`format::rebuild_state`]: any column types).
    pub fn state(&self, id: CheckpointId, task: &TaskId) -> Result<Option<RecordBatch>> {
        // A rebuild reads no time index.
        let chain = self.links(id, task, false, &CheckedFiles::new(), false)?;
        if chain.is_empty() {
            return Ok(None);
        }
        rebuild_chain(&chain).map(Some)
    }

    /// Channel contents `task` recorded at checkpoint `id`.
    pub fn channels(&self, id: CheckpointId, task: &TaskId) -> Result<Vec<ChannelLog>> {
        let manifest = self.manifest(id)?;
        let mut out = Vec::new();
        for f in format::channel_files(&manifest, task) {
            let (_, records) = self.read_file(id, f)?;
            out.push(ChannelLog {
                input: f.input.unwrap_or_default(),
                edge: f.edge.clone().unwrap_or_default(),
                from_subtask: f.from_subtask.unwrap_or_default(),
                records,
            });
        }
        Ok(out)
    }

    /// Checkpoint `id` verified and loaded whole, in the form the runtime
    /// restores from: every task's state rebuilt to a full capture, its
    /// channel logs and source offset.
    pub fn load(&self, id: CheckpointId) -> Result<CompletedCheckpoint> {
        self.load_with(id, false)
    }

    /// As [`Self::load`], with no state rebuilt: every task's state is its
    /// runs as the store lists them, mapped ([`Self::state_runs`]), in
    /// [`CompletedCheckpoint::state_runs`] (and `TaskSnapshot::state` is
    /// `None`). A restore then opens the runs lazily where the operator
    /// keeps runs, and rebuilds the state in the task that needs it whole.
    pub fn load_runs(&self, id: CheckpointId) -> Result<CompletedCheckpoint> {
        self.load_with(id, true)
    }

    fn load_with(&self, id: CheckpointId, runs: bool) -> Result<CompletedCheckpoint> {
        let (manifest, checked) = self.verify_keeping(id, runs)?;
        let protocol: ProtocolKind = manifest.protocol.parse().map_err(|e| {
            Error::Snapshot(format!(
                "checkpoint {id}: manifest names an unknown protocol: {e}"
            ))
        })?;
        let meta = CheckpointMeta {
            id,
            protocol,
            started_ms: manifest.started_ms,
            finished_ms: manifest.finished_ms,
            graph_fingerprint: manifest.graph_fingerprint.clone(),
            savepoint: manifest.savepoint,
        };
        let mut tasks = BTreeMap::new();
        let mut state_runs = BTreeMap::new();
        for t in &manifest.tasks {
            let task = t.task();
            let state = if runs {
                let chain = self.links(id, &task, true, &checked, true)?;
                if !chain.is_empty() {
                    state_runs.insert(task.clone(), chain);
                }
                None
            } else {
                self.state(id, &task)?.map(|batch| StateCapture {
                    kind: StateKind::Full,
                    batch,
                    filter: None,
                    times: None,
                })
            };
            let snapshot = TaskSnapshot {
                task: task.clone(),
                state,
                state_runs: None,
                channels: self.channels(id, &task)?,
                source_offset: t.source_offset,
                alignment_nanos: t.alignment_nanos,
                sent_seq: t.sent_seq.clone(),
                taken_seq: t.taken_seq.clone(),
            };
            tasks.insert(task, snapshot);
        }
        // Every restore reads its checkpoint here first; a crash now must
        // leave the store as it was (a restore only reads).
        crate::failpoint::hit("restore.after_load");
        Ok(CompletedCheckpoint {
            meta,
            tasks,
            state_runs,
        })
    }

    /// [`Self::load`] of the newest intact checkpoint, with the skipped ones.
    pub fn load_latest_intact(&self) -> Result<(CompletedCheckpoint, Vec<Skipped>)> {
        let (manifest, skipped) = self.latest_intact()?;
        Ok((self.load(manifest.checkpoint_id)?, skipped))
    }

    /// Where a restart begins: the newest intact checkpoint loaded with its
    /// states as runs ([`Self::load_runs`]: nothing rebuilt until a task
    /// restores), or `None` when the root holds none (every corrupt or
    /// partial one is listed as skipped, with the reason).
    pub fn restore_point(&self) -> Result<(Option<CompletedCheckpoint>, Vec<Skipped>)> {
        let mut skipped = Vec::new();
        for (id, _) in self.restorable_or_partial()?.into_iter().rev() {
            // `load_runs` verifies first: a corrupt checkpoint fails there.
            match self.load_runs(id) {
                Ok(checkpoint) => return Ok((Some(checkpoint), skipped)),
                Err(e) => skipped.push(Skipped {
                    id,
                    reason: e.to_string(),
                }),
            }
        }
        Ok((None, skipped))
    }

    /// Source offsets at checkpoint `id`, per source task.
    pub fn source_offsets(&self, id: CheckpointId) -> Result<BTreeMap<TaskId, u64>> {
        let manifest = self.manifest(id)?;
        Ok(manifest
            .tasks
            .iter()
            .filter_map(|t| Some((t.task(), t.source_offset?)))
            .collect())
    }
}

/// The full state at the end of `chain` (a full capture, then diffs, as
/// [`SnapshotReader::state_chain`] gives them), rebuilt in memory
/// ([`format::rebuild_state`]: any column types).
pub fn rebuild_chain(chain: &[(CheckpointId, StateCapture)]) -> Result<RecordBatch> {
    let links: Vec<(FileKind, RecordBatch)> = chain
        .iter()
        .map(|(_, c)| {
            let kind = match c.kind {
                StateKind::Full => FileKind::Full,
                StateKind::Diff { .. } => FileKind::Diff,
            };
            (kind, c.batch.clone())
        })
        .collect();
    format::rebuild_state(&links)
}

/// An empty table able to replay a chain whose full batch has `schema`.
pub(crate) fn table_for(
    schema: &Arc<Schema>,
    id: CheckpointId,
    task: &TaskId,
) -> Result<StateTable> {
    let key = schema.metadata().get(KEY_METADATA).ok_or_else(|| {
        Error::Snapshot(format!(
            "checkpoint {id}: state file of {task} has no '{KEY_METADATA}' schema metadata naming its key"
        ))
    })?;
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .filter(|f| f.name() != DELETED_COLUMN)
        .cloned()
        .collect();
    let plain = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    StateTable::new(
        plain,
        key,
        StatePolicy {
            full_every: u32::MAX,
        },
    )
    .map_err(|e| Error::Snapshot(format!("checkpoint {id}: state file of {task}: {e}")))
}
