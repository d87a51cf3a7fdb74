//! The snapshot format's rules, with no I/O (in the style of
//! [`crate::protocol`]). The spec is `docs/format.md`.
//!
//! Everything that touches a filesystem calls these: the Rust store and
//! reader on local paths (`files.rs`, `reader.rs`, `sink.rs` keep only the
//! `std::fs` calls), and, through the bindings, the Python backend that moves
//! bytes for URIs (pyarrow filesystems, Spark executors).
//!
//! One concern per module, all re-exported here flat (callers write
//! `format::encode_ipc`, not where it lives):
//! - `encode`: an Arrow IPC file's bytes, encoded with their size and
//!   checksum, decoded without copying;
//! - `tables`: what the Arrow files hold (a state table as stored, the
//!   source offsets);
//! - `entries`: a manifest's file and task entries, the manifest built,
//!   serialised, parsed and looked up;
//! - `listing`: a root's checkpoints as a listing shows them, summarised;
//! - `chain`: diff chains, resolved and walked;
//! - `runs`: a state as sorted runs (format 2), listed or implied by a
//!   chain, and the links a restore reads;
//! - `compaction`: which runs to merge, the merge, and its adoption;
//! - `filters`: a state diff's bloom filter stored beside it (format 3);
//! - `times`: a full's time index stored beside it (format 5);
//! - `rebuild`: state rebuilt from a chain;
//! - `verify`: a file checked against its entry, a checkpoint verified;
//! - `held`: a held directory's record (runs of removed checkpoints);
//! - `retention`: which checkpoints may be deleted, which directories held;
//! - `export`: which file becomes which part of an export.
//!
//! The modules depend on each other in one direction only (`entries`,
//! `verify` → `encode`; `rebuild`, `verify`, `runs` → `chain`; `verify` →
//! `runs`, `entries`; `filters` → `verify`, `entries`; `times` → `entries`), never on this one.

mod chain;
mod compaction;
mod encode;
mod entries;
mod export;
mod filters;
mod held;
mod listing;
mod rebuild;
mod retention;
mod runs;
mod tables;
#[cfg(test)]
mod testing;
mod times;
mod verify;

pub use chain::{chain_after, chain_link, diff_chain, link_kind, state_chain};
pub use compaction::{
    adopt, merge_batches, merge_span, merged_run, plan_compaction, CompactionPlan, MergeKind,
    BASE_MERGE_RATIO,
};
pub(crate) use encode::Checksummed;
pub use encode::{
    concat, decode_buffer, decode_ipc, encode_ipc, encode_ipc_into, EncodeError, Written,
};
pub use entries::{
    build_manifest, channel_entry, channel_files, filter_file_entry, manifest_bytes, other_entry,
    parse_manifest, run_counts, sources_entry, state_entry, state_files, state_run_counts,
    task_entries, ManifestMeta, RunCounts,
};
pub use export::{export_plan, ExportPart};
pub use filters::{diff_filter, filter_entry, read_filter};
pub use held::{held_bytes, held_record, parse_held, HeldRecord, HELD_FORMAT, HELD_FORMAT_VERSION};
pub use listing::{held_files, missing_manifest, scan_listing, summarize, DirState, Summary};
pub use rebuild::rebuild_state;
pub use retention::{retention, retention_of_root, Hold, InProgress, RetentionPlan};
pub use runs::{
    check_runs, key_json, key_range, own_run, resolve_chains, runs_after, runs_chain, runs_of,
    state_links, StateLink,
};
pub use tables::{sort_by_key, sources_batch, sources_schema, state_batch, state_schema};
pub use times::{check_times, times_entry, times_file_entry};
pub use verify::{
    check_file, check_file_in_slices, check_structure, missing_file, plan_verify, plan_verify_with,
    verify_with, VerifyPlan,
};
