//! What a manifest holds: the entry of each file a checkpoint writes (state,
//! channel, sources, or a role left to its writer), its task entries, the
//! manifest itself built, serialised and parsed, and the look-ups tools make
//! in it (a task's state and channel files).

use std::collections::{BTreeMap, BTreeSet};

use super::encode::Written;
use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::snapshot::TaskId;
use crate::store::manifest::{
    channel_file_name, state_file_name, FileEntry, FileKind, FileRole, FilterEntry, Manifest,
    TaskEntry, FILTER_ROLE, FORMAT_NAME, FORMAT_VERSION, SOURCES_FILE,
};

fn bare_entry(path: &str, role: FileRole, written: Written) -> FileEntry {
    FileEntry {
        path: path.into(),
        role,
        rows: written.rows,
        bytes: written.bytes,
        crc32c: written.crc32c,
        vertex: None,
        subtask: None,
        kind: None,
        base: None,
        chain: Vec::new(),
        runs: Vec::new(),
        filter: None,
        times: None,
        key: None,
        edge: None,
        input: None,
        from_subtask: None,
        extra: Default::default(),
    }
}

/// The entry of a file of a role this format leaves to its writer (the
/// Spark sink's `output`), with the writer's own `fields`.
pub fn other_entry(
    path: &str,
    role: &str,
    written: Written,
    fields: serde_json::Map<String, serde_json::Value>,
) -> FileEntry {
    FileEntry {
        extra: fields,
        ..bare_entry(path, FileRole::from(role.to_string()), written)
    }
}

/// The entry of `task`'s state file (`written` still to be filled in when
/// the bytes are written later): full, or a diff against `base`.
pub fn state_entry(
    task: &TaskId,
    key: Option<String>,
    base: Option<CheckpointId>,
    written: Written,
) -> FileEntry {
    FileEntry {
        vertex: Some(task.vertex.clone()),
        subtask: Some(task.subtask),
        kind: Some(if base.is_some() {
            FileKind::Diff
        } else {
            FileKind::Full
        }),
        base,
        key,
        ..bare_entry(&state_file_name(task), FileRole::State, written)
    }
}

/// The entry of a channel file of `task` (recorded from `edge`'s `from_subtask`).
pub fn channel_entry(
    task: &TaskId,
    edge: &str,
    input: usize,
    from_subtask: usize,
    written: Written,
) -> FileEntry {
    FileEntry {
        vertex: Some(task.vertex.clone()),
        subtask: Some(task.subtask),
        edge: Some(edge.into()),
        input: Some(input),
        from_subtask: Some(from_subtask),
        ..bare_entry(
            &channel_file_name(task, edge, from_subtask),
            FileRole::Channel,
            written,
        )
    }
}

/// A state file's stored filter (format 3) as an entry of `task`, to be
/// read and checked like a manifest's file (role [`FILTER_ROLE`], no rows).
pub fn filter_file_entry(filter: &FilterEntry, task: Option<&TaskId>) -> FileEntry {
    let written = Written {
        rows: 0,
        bytes: filter.bytes,
        crc32c: filter.crc32c,
    };
    sidecar_entry(&filter.path, FILTER_ROLE, written, task)
}

/// A file stored beside a state file (a filter, a time index) as an entry
/// of `task` of role `role`, to be read and checked like a manifest's file.
pub(super) fn sidecar_entry(
    path: &str,
    role: &str,
    written: Written,
    task: Option<&TaskId>,
) -> FileEntry {
    FileEntry {
        vertex: task.map(|t| t.vertex.clone()),
        subtask: task.map(|t| t.subtask),
        ..bare_entry(path, FileRole::Other(role.into()), written)
    }
}

/// The entry of `sources.arrow`.
pub fn sources_entry(written: Written) -> FileEntry {
    bare_entry(SOURCES_FILE, FileRole::Sources, written)
}

/// The tasks of a checkpoint: those named, those with an offset, and those
/// owning a file, sorted by (vertex, subtask).
pub fn task_entries(
    tasks: &[TaskId],
    offsets: &BTreeMap<TaskId, u64>,
    files: &[FileEntry],
) -> Vec<TaskEntry> {
    let mut all: BTreeSet<(String, usize)> = tasks
        .iter()
        .chain(offsets.keys())
        .map(|t| (t.vertex.clone(), t.subtask))
        .collect();
    all.extend(
        files
            .iter()
            .filter_map(|f| Some((f.vertex.clone()?, f.subtask?))),
    );
    all.into_iter()
        .map(|(vertex, subtask)| {
            let task = TaskId { vertex, subtask };
            TaskEntry {
                source_offset: offsets.get(&task).copied(),
                vertex: task.vertex,
                subtask: task.subtask,
                alignment_nanos: 0,
                sent_seq: Vec::new(),
                taken_seq: Vec::new(),
            }
        })
        .collect()
}

/// What a manifest says about its checkpoint, besides tasks and files.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ManifestMeta {
    pub checkpoint_id: CheckpointId,
    pub protocol: String,
    pub started_ms: u64,
    pub finished_ms: u64,
    pub committed_ms: u64,
    pub graph_fingerprint: String,
    pub savepoint: bool,
    /// Top-level fields of an engine (e.g. Spark's `"spark"`).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// The manifest of a checkpoint (whose state files' chains are resolved).
pub fn build_manifest(
    meta: ManifestMeta,
    tasks: Vec<TaskEntry>,
    files: Vec<FileEntry>,
) -> Manifest {
    Manifest {
        format: FORMAT_NAME.into(),
        format_version: FORMAT_VERSION,
        checkpoint_id: meta.checkpoint_id,
        protocol: meta.protocol,
        started_ms: meta.started_ms,
        finished_ms: meta.finished_ms,
        committed_ms: meta.committed_ms,
        graph_fingerprint: meta.graph_fingerprint,
        savepoint: meta.savepoint,
        tasks,
        files,
        extra: meta.extra,
    }
}

/// A manifest's bytes as written.
pub fn manifest_bytes(manifest: &Manifest) -> Vec<u8> {
    serde_json::to_vec_pretty(manifest).expect("manifest serialises")
}

/// Parses the manifest of checkpoint `id` (`what` names it in errors).
pub fn parse_manifest(bytes: &[u8], what: &str, id: CheckpointId) -> Result<Manifest> {
    let manifest = Manifest::parse(bytes, what)?;
    if manifest.checkpoint_id != id {
        return Err(Error::Snapshot(format!(
            "{what} names checkpoint {}, expected {id}",
            manifest.checkpoint_id
        )));
    }
    Ok(manifest)
}

/// The state files of a checkpoint, per task, in manifest order.
pub fn state_files(manifest: &Manifest) -> impl Iterator<Item = (TaskId, &FileEntry)> {
    manifest
        .files
        .iter()
        .filter(|f| f.role == FileRole::State)
        .filter_map(|f| Some((f.task()?, f)))
}

/// What a manifest says of its files and runs (the store's metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunCounts {
    /// Bytes of the files it lists (its own).
    pub files_bytes: u64,
    /// Most runs one task's state is made of (its chain's files where it
    /// lists no runs), and every task's.
    pub runs_max: u64,
    pub runs_total: u64,
    /// Bytes of diff runs on the tasks' fulls.
    pub debt_bytes: u64,
}

pub fn run_counts(manifest: &Manifest) -> RunCounts {
    RunCounts {
        files_bytes: manifest.files.iter().map(|f| f.bytes).sum(),
        ..state_run_counts(state_files(manifest).map(|(_, f)| f))
    }
}

/// [`RunCounts`] of state file entries, without `files_bytes` (a writer
/// that builds a manifest's entries in several processes: Spark's tasks).
pub fn state_run_counts<'a>(entries: impl IntoIterator<Item = &'a FileEntry>) -> RunCounts {
    let mut c = RunCounts::default();
    for f in entries {
        let runs = if f.runs.is_empty() {
            f.chain.len().max(1)
        } else {
            f.runs.len()
        };
        let runs = runs as u64;
        c.runs_max = c.runs_max.max(runs);
        c.runs_total += runs;
        c.debt_bytes += f
            .runs
            .iter()
            .filter(|r| r.kind == FileKind::Diff)
            .map(|r| r.bytes)
            .sum::<u64>();
    }
    c
}

/// The channel files `task` recorded at a checkpoint, in manifest order.
pub fn channel_files<'m>(
    manifest: &'m Manifest,
    task: &'m TaskId,
) -> impl Iterator<Item = &'m FileEntry> {
    manifest
        .files
        .iter()
        .filter(move |f| f.role == FileRole::Channel && f.task().as_ref() == Some(task))
}
