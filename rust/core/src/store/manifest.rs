//! The manifest: the one JSON file that makes a checkpoint complete, and the
//! names of everything in a checkpoint directory. The Python reader/writer
//! (`snapcut.snapshots`) uses the same constants, exported by the bindings.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::snapshot::TaskId;

/// Value of the manifest's `format` field.
pub const FORMAT_NAME: &str = "snapcut-snapshot";
/// The manifest format version this code writes and the newest it reads.
/// Version 2 added a state entry's `runs` ([`RunEntry`]); version 3 a diff's
/// stored bloom filter ([`FilterEntry`]); version 4 runs in held
/// directories ([`HELD_FILE`]): a run's checkpoint need not be complete;
/// version 5 a full's stored time index ([`TimesEntry`]).
/// Older roots (no runs: the chain alone rebuilds a state; no filters: a
/// restore builds them) are read as they are.
pub const FORMAT_VERSION: u32 = 5;
/// File name of the manifest inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// File name of a held directory's record (in place of a manifest): the
/// directory of a checkpoint retention removed whose runs newer checkpoints
/// still read (`format::HeldRecord`).
pub const HELD_FILE: &str = "held.json";
/// Temporary name the held record is written under before its rename.
pub const HELD_TMP_FILE: &str = "held.json.tmp";
/// Temporary name the manifest is written under before the atomic rename.
pub const MANIFEST_TMP_FILE: &str = "manifest.json.tmp";
/// File holding every source task's offset.
pub const SOURCES_FILE: &str = "sources.arrow";
/// Prefix of checkpoint directory names (`chk-00000042`).
pub const CHECKPOINT_DIR_PREFIX: &str = "chk-";

/// Directory name of checkpoint `id`.
pub fn checkpoint_dir_name(id: CheckpointId) -> String {
    format!("{CHECKPOINT_DIR_PREFIX}{id:08}")
}

/// Parses a checkpoint directory name back to its id.
pub fn parse_checkpoint_dir(name: &str) -> Option<CheckpointId> {
    let digits = name.strip_prefix(CHECKPOINT_DIR_PREFIX)?;
    (digits.len() >= 8 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// A name safe as part of a file name on any filesystem and object store:
/// ASCII letters, digits, `_` and `-` stay, every other byte becomes `%XX`.
pub fn file_component(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `<vertex>-<subtask>.state.arrow`
pub fn state_file_name(task: &TaskId) -> String {
    format!(
        "{}-{}.state.arrow",
        file_component(&task.vertex),
        task.subtask
    )
}

/// `<vertex>-<subtask>.channel-<edge>.<from_subtask>.arrow`
pub fn channel_file_name(task: &TaskId, edge: &str, from_subtask: usize) -> String {
    format!(
        "{}-{}.channel-{}.{from_subtask}.arrow",
        file_component(&task.vertex),
        task.subtask,
        file_component(edge)
    )
}

/// What a file of a checkpoint holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum FileRole {
    State,
    Channel,
    Sources,
    /// A role this code does not know (e.g. `"output"`, the files of
    /// snapcut's Spark sink): verified like every file, otherwise ignored,
    /// and written back under its own name.
    Other(String),
}

impl From<String> for FileRole {
    fn from(role: String) -> Self {
        match role.as_str() {
            "state" => Self::State,
            "channel" => Self::Channel,
            "sources" => Self::Sources,
            _ => Self::Other(role),
        }
    }
}

impl From<FileRole> for String {
    fn from(role: FileRole) -> Self {
        match role {
            FileRole::State => "state".into(),
            FileRole::Channel => "channel".into(),
            FileRole::Sources => "sources".into(),
            FileRole::Other(other) => other,
        }
    }
}

/// `<vertex>-<subtask>.run-<first>-<last>.state.arrow`: a compaction's
/// output merging the runs of checkpoints `first..=last`, stored in the
/// directory of the checkpoint that adopted it.
pub fn run_file_name(task: &TaskId, first: CheckpointId, last: CheckpointId) -> String {
    format!(
        "{}-{}.run-{first}-{last}.state.arrow",
        file_component(&task.vertex),
        task.subtask
    )
}

/// `<file name without .arrow>.bloom`: the bloom filter of a state file's
/// keys, stored beside it (format 3).
pub fn filter_file_name(state_file: &str) -> String {
    format!(
        "{}.bloom",
        state_file.strip_suffix(".arrow").unwrap_or(state_file)
    )
}

/// The role a filter file has when it is checked like a file of a manifest.
pub const FILTER_ROLE: &str = "filter";

/// A state diff's bloom filter (format 3), a file of its own beside the
/// state file, in the same directory: Parquet's split-block bloom filter of
/// the file's keys (`crate::state::runs::filter`), so that a restore finds
/// the run's filter without hashing every key again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterEntry {
    /// File name inside the directory that holds the state file.
    pub path: String,
    pub bytes: u64,
    /// CRC-32C (Castagnoli) of the whole file.
    pub crc32c: u32,
}

/// The name of the time index stored beside the full state file
/// `state_file` (format 5): an Arrow IPC file.
pub fn times_file_name(state_file: &str) -> String {
    format!(
        "{}.times.arrow",
        state_file.strip_suffix(".arrow").unwrap_or(state_file)
    )
}

/// The role a time index file has when it is checked like a file of a
/// manifest.
pub const TIMES_ROLE: &str = "times";

/// A full state file's time index (format 5), a file of its own beside it:
/// the (time, key) entries of its rows' `column` (a state table's time
/// index, `crate::state::time_index`), sorted, as one Arrow IPC column
/// `time_key`, as Spark's RocksDB provider checkpoints its TTL column
/// family. A restore takes it as the index's base run instead of reading
/// every row's time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimesEntry {
    /// File name inside the directory that holds the state file.
    pub path: String,
    /// The state file's time column the entries index.
    pub column: String,
    /// Entries (the full's rows whose time is not null).
    pub rows: u64,
    pub bytes: u64,
    /// CRC-32C (Castagnoli) of the whole file.
    pub crc32c: u32,
}

/// Whether a state file is a full table or a diff against `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    Full,
    Diff,
}

/// One file of a checkpoint, as the manifest describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name inside the checkpoint directory.
    pub path: String,
    pub role: FileRole,
    pub rows: u64,
    pub bytes: u64,
    /// CRC-32C (Castagnoli) of the whole file.
    pub crc32c: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vertex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subtask: Option<usize>,
    /// State files: full or diff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<FileKind>,
    /// State diffs: the checkpoint this diff applies on top of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<CheckpointId>,
    /// State files: checkpoints whose state files rebuild this one, oldest
    /// (the full) first, ending with this checkpoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chain: Vec<CheckpointId>,
    /// State files (format 2): the sorted runs the task's state is made of,
    /// newest first, the oldest a full; empty when the `chain` alone
    /// rebuilds it (format 1, or a writer that lists no runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<RunEntry>,
    /// State diffs (format 3): the bloom filter of the file's keys, stored
    /// beside it; absent for a full, an empty diff, or an older writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<FilterEntry>,
    /// Full state files (format 5): the time index stored beside it; absent
    /// for a diff, a table without a time index, or an older writer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<TimesEntry>,
    /// State files: the key column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Channel files: logical edge, input index, upstream subtask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_subtask: Option<usize>,
    /// Fields this code does not know (e.g. an output file's `partition`),
    /// kept like the manifest's own unknown fields.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl FileEntry {
    pub fn task(&self) -> Option<TaskId> {
        Some(TaskId {
            vertex: self.vertex.clone()?,
            subtask: self.subtask?,
        })
    }
}

/// One sorted run of a task's state (format 2): a state file of some
/// checkpoint, a diff as a task wrote it or a compaction's output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunEntry {
    /// The checkpoint whose directory holds the file.
    pub checkpoint: CheckpointId,
    /// File name inside that directory.
    pub path: String,
    /// `full`: a base, the whole state as of its last merged checkpoint (the
    /// oldest run only); `diff`: upserts and `__deleted` tombstones.
    pub kind: FileKind,
    pub rows: u64,
    pub bytes: u64,
    pub crc32c: u32,
    /// Smallest and largest key held (integers as numbers, UTF-8 keys as
    /// strings, other bytes as `{"hex": ...}`); absent when empty or not known
    /// (a run listed from a format 1 chain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_range: Option<(serde_json::Value, serde_json::Value)>,
    /// A diff run's stored bloom filter, in the same directory as its file
    /// (format 3); absent for a full or when not stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<FilterEntry>,
    /// A full run's stored time index, in the same directory as its file
    /// (format 5); absent for a diff or when not stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<TimesEntry>,
    /// The checkpoints whose state files this run holds merged, oldest first
    /// (one for a file as a task wrote it); its last is the checkpoint whose
    /// state the runs up to this one rebuild.
    pub merges: Vec<CheckpointId>,
}

impl RunEntry {
    /// The checkpoint whose state the runs up to this one rebuild.
    pub fn state_at(&self) -> CheckpointId {
        self.merges.last().copied().unwrap_or(self.checkpoint)
    }

    /// The run's file as a state file entry of `task` (keyed by `key`), to
    /// be read and checked like one.
    pub fn file_entry(&self, task: &TaskId, key: Option<String>) -> FileEntry {
        FileEntry {
            path: self.path.clone(),
            role: FileRole::State,
            rows: self.rows,
            bytes: self.bytes,
            crc32c: self.crc32c,
            vertex: Some(task.vertex.clone()),
            subtask: Some(task.subtask),
            kind: Some(self.kind),
            base: None,
            chain: Vec::new(),
            runs: Vec::new(),
            filter: self.filter.clone(),
            times: self.times.clone(),
            key,
            edge: None,
            input: None,
            from_subtask: None,
            extra: Default::default(),
        }
    }
}

/// One task of a checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskEntry {
    pub vertex: String,
    pub subtask: usize,
    #[serde(default)]
    pub source_offset: Option<u64>,
    #[serde(default)]
    pub alignment_nanos: u64,
    /// Per output channel: records sent before the barrier (see
    /// [`crate::snapshot::TaskSnapshot::sent_seq`]); absent when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sent_seq: Vec<u64>,
    /// Per input: the last sequence number before the barrier.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taken_seq: Vec<u64>,
}

impl TaskEntry {
    pub fn task(&self) -> TaskId {
        TaskId {
            vertex: self.vertex.clone(),
            subtask: self.subtask,
        }
    }
}

/// Contents of `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    pub checkpoint_id: CheckpointId,
    pub protocol: String,
    pub started_ms: u64,
    pub finished_ms: u64,
    pub committed_ms: u64,
    pub graph_fingerprint: String,
    pub savepoint: bool,
    pub tasks: Vec<TaskEntry>,
    pub files: Vec<FileEntry>,
    /// Top-level fields this code does not know (an engine's own record,
    /// e.g. `"spark"` of Spark roots), kept so that reading and re-serialising
    /// a manifest loses nothing.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Manifest {
    /// Parses and checks a manifest's bytes (`what` names it in errors).
    pub fn parse(bytes: &[u8], what: &str) -> Result<Self> {
        // Read the version first so a newer manifest fails on its version,
        // not on a field this code does not know.
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::Snapshot(format!("{what} is not valid JSON: {e}")))?;
        let version = value.get("format_version").and_then(|v| v.as_u64());
        match version {
            None => {
                return Err(Error::Snapshot(format!(
                    "{what} has no format_version: not a snapcut manifest"
                )))
            }
            Some(v) if v > u64::from(FORMAT_VERSION) => {
                return Err(Error::Snapshot(format!(
                    "{what} has format_version {v}, newer than the {FORMAT_VERSION} this snapcut \
                     reads: upgrade snapcut to read it"
                )))
            }
            Some(_) => {}
        }
        let manifest: Manifest = serde_json::from_value(value)
            .map_err(|e| Error::Snapshot(format!("{what} is malformed: {e}")))?;
        if manifest.format != FORMAT_NAME {
            return Err(Error::Snapshot(format!(
                "{what} has format '{}', expected '{FORMAT_NAME}'",
                manifest.format
            )));
        }
        Ok(manifest)
    }

    /// The state file entry of `task`, if it has state in this checkpoint.
    pub fn state_file(&self, task: &TaskId) -> Option<&FileEntry> {
        self.files.iter().find(|f| {
            f.role == FileRole::State
                && f.vertex.as_deref() == Some(task.vertex.as_str())
                && f.subtask == Some(task.subtask)
        })
    }

    /// Every checkpoint whose manifest this one needs (itself included):
    /// the chains of its state files that list no runs (format 1: a chain
    /// is read link by link through its manifests). A state listing runs
    /// needs their files only ([`Self::reads`]).
    pub fn needs(&self) -> Vec<CheckpointId> {
        let mut ids: Vec<CheckpointId> = self
            .files
            .iter()
            .filter(|f| f.runs.is_empty())
            .flat_map(|f| f.chain.iter().copied())
            .chain([self.checkpoint_id])
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

impl Manifest {
    /// Every file a restore of this checkpoint reads, by (checkpoint whose
    /// directory holds it, name): its own files and their filters, and the
    /// runs its states list with theirs. The files of a chain's other links
    /// (format 1) are not here: [`Self::needs`] keeps their checkpoints whole.
    pub fn reads(&self) -> BTreeSet<(CheckpointId, String)> {
        let own = self.checkpoint_id;
        let mut out = BTreeSet::new();
        for f in &self.files {
            out.insert((own, f.path.clone()));
            out.extend(f.filter.iter().map(|x| (own, x.path.clone())));
            out.extend(f.times.iter().map(|x| (own, x.path.clone())));
            for r in &f.runs {
                out.insert((r.checkpoint, r.path.clone()));
                out.extend(r.filter.iter().map(|x| (r.checkpoint, x.path.clone())));
                out.extend(r.times.iter().map(|x| (r.checkpoint, x.path.clone())));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_file_roles_parse_and_round_trip() {
        let json = r#"{"format": "snapcut-snapshot", "format_version": 1, "checkpoint_id": 3,
            "protocol": "spark-microbatch", "started_ms": 0, "finished_ms": 0,
            "committed_ms": 0, "graph_fingerprint": "", "savepoint": false, "tasks": [],
            "files": [{"path": "part-00000.arrow", "role": "output", "rows": 2, "bytes": 10,
                       "crc32c": 7, "partition": 0},
                      {"path": "sources.arrow", "role": "sources", "rows": 0, "bytes": 1,
                       "crc32c": 1}],
            "output": {"mode": "append"}}"#;
        let m = Manifest::parse(json.as_bytes(), "test").unwrap();
        assert_eq!(m.files[0].role, FileRole::Other("output".into()));
        assert_eq!(m.files[1].role, FileRole::Sources);
        assert!(m.extra.contains_key("output"));
        let again = serde_json::to_value(&m).unwrap();
        assert_eq!(again["files"][0]["role"], "output");
        assert_eq!(again["files"][0]["partition"], 0);
        assert_eq!(again["files"][1]["role"], "sources");
    }
}
