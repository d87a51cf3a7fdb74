//! Diff chains: the checkpoints whose state files rebuild a task's state,
//! oldest (a full) first. A diff's chain is its base's chain then its own
//! checkpoint, resolved when its manifest is built; a restore and a verify
//! walk it link by link.

use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::snapshot::{StateKind, TaskId};
use crate::store::manifest::{FileEntry, FileKind, Manifest};

/// The chain of a state diff of `task` at `id` based on `base`: the chain of
/// `base`'s state file for the task (its manifest: `base_manifest`), then `id`.
/// `committed` says whether a checkpoint is still there to be read.
pub fn diff_chain(
    id: CheckpointId,
    task: &TaskId,
    base: CheckpointId,
    base_manifest: Option<&Manifest>,
    committed: impl Fn(CheckpointId) -> bool,
) -> Result<Vec<CheckpointId>> {
    let base_entry = base_manifest
        .and_then(|m| m.state_file(task))
        .ok_or_else(|| {
            Error::Snapshot(format!(
                "checkpoint {id}: state diff of {task} is based on checkpoint {base}, which is \
             not a committed checkpoint holding its state; take a full capture instead"
            ))
        })?;
    let base_chain = state_chain(base, base_entry);
    if let Some(lost) = base_chain.iter().find(|c| !committed(**c)) {
        return Err(Error::Snapshot(format!(
            "checkpoint {id}: state diff of {task} is based on checkpoint {base}, whose \
             chain needs checkpoint {lost}, which retention removed; take a full \
             capture instead"
        )));
    }
    Ok(chain_after(id, Some(&base_chain)))
}

/// The chain of a state file written at `id`: `[id]` for a full (no
/// `base_chain`), the base's chain then `id` for a diff.
pub fn chain_after(id: CheckpointId, base_chain: Option<&[CheckpointId]>) -> Vec<CheckpointId> {
    let mut chain = base_chain.map(<[_]>::to_vec).unwrap_or_default();
    chain.push(id);
    chain
}

/// The checkpoints whose state files rebuild `task`'s state at `id`
/// (`entry`: its state file there), oldest first.
pub fn state_chain(id: CheckpointId, entry: &FileEntry) -> Vec<CheckpointId> {
    if entry.chain.is_empty() {
        vec![id]
    } else {
        entry.chain.clone()
    }
}

/// `task`'s state file at `cid`, a link of the chain of `id`.
pub fn chain_link<'m>(
    id: CheckpointId,
    task: &TaskId,
    cid: CheckpointId,
    manifest: &'m Manifest,
) -> Result<&'m FileEntry> {
    manifest.state_file(task).ok_or_else(|| {
        Error::Snapshot(format!(
            "checkpoint {id}: state of {task} needs checkpoint {cid}, which has no state file for it"
        ))
    })
}

/// What a link of a state chain holds: a full state, or a diff that names
/// its base (`cid`: the link's checkpoint, for the error).
pub fn link_kind(cid: CheckpointId, entry: &FileEntry) -> Result<StateKind> {
    match (entry.kind, entry.base) {
        (Some(FileKind::Diff), Some(base)) => Ok(StateKind::Diff { base }),
        (Some(FileKind::Full) | None, _) => Ok(StateKind::Full),
        (Some(FileKind::Diff), None) => Err(Error::Snapshot(format!(
            "checkpoint {cid}: diff state file {} has no base",
            entry.path
        ))),
    }
}

/// The name of `kind` as a manifest spells it (for messages).
pub(super) fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Full => "full",
        FileKind::Diff => "diff",
    }
}
