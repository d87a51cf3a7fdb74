//! Snapshot store: Arrow IPC files + manifest, atomic commit, checksums, retention, verify.
//!
//! Layout (the spec: `docs/format.md`), under a root directory:
//! ```text
//! chk-00000042/
//!   manifest.json                        written last, by atomic rename
//!   <vertex>-<subtask>.state.arrow        full table, or diff with `__deleted`
//!   <vertex>-<subtask>.channel-<edge>.<from>.arrow   recorded in-flight records
//!   sources.arrow                         source offsets (vertex, subtask, offset)
//! ```
//! [`format`] holds the format's rules with no I/O (encoding, checks,
//! chains, state rebuild, manifests, retention, verify plans); everything
//! else here is the `std::fs` side of them. [`SnapshotStore`] is the durable
//! [`crate::snapshot::SnapshotSink`]; [`SnapshotReader`] lists, verifies and
//! rebuilds state from manifests alone.

mod compactor;
mod direct;
mod files;
pub mod format;
mod manifest;
mod mapped;
mod pace;
mod presized;
mod reader;
mod run_files;
mod sink;
mod spill;
mod streamed;
mod time_files;
mod writer;

pub use crate::snapshot::CompactionStats;
pub use compactor::{
    CompactionBudget, CompactionHold, Compactor, Finished as CompactionOutput,
    Job as CompactionJob, COMPACTING_DIR, HOLD_TIMEOUT as COMPACTION_HOLD_TIMEOUT,
    QUEUE as COMPACTION_QUEUE, SHUTDOWN_TIMEOUT as COMPACTION_SHUTDOWN_TIMEOUT,
};
pub use files::{write_file, write_ipc, Fsync, FsyncMode};
pub use format::Written;
pub use manifest::{
    channel_file_name, checkpoint_dir_name, file_component, filter_file_name, parse_checkpoint_dir,
    run_file_name, state_file_name, times_file_name, FileEntry, FileKind, FileRole, FilterEntry,
    Manifest, RunEntry, TaskEntry, TimesEntry, CHECKPOINT_DIR_PREFIX, FILTER_ROLE, FORMAT_NAME,
    FORMAT_VERSION, HELD_FILE, HELD_TMP_FILE, MANIFEST_FILE, MANIFEST_TMP_FILE, SOURCES_FILE,
    TIMES_ROLE,
};
pub use mapped::{map_file_pages, MappedPages};
pub use presized::{ColumnSize, PresizedFile};
pub use reader::rebuild_chain;
pub(crate) use reader::table_for;
pub use reader::{Skipped, SnapshotReader};
pub use run_files::{write_chunks, write_state_runs, RUN_CHUNK_ROWS};
pub use sink::{SnapshotStore, StoreOptions};
pub use spill::LocalRuns;
pub use streamed::StreamedFile;
pub use time_files::write_times;
