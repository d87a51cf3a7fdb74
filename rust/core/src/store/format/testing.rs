//! Manifests for the format's unit tests.

use super::encode::Written;
use super::entries::{build_manifest, state_entry, ManifestMeta};
use crate::protocol::CheckpointId;
use crate::snapshot::TaskId;
use crate::store::manifest::{FileEntry, Manifest};

/// What an entry whose bytes do not matter says it wrote.
pub(super) const NOTHING: Written = Written {
    rows: 0,
    bytes: 0,
    crc32c: 0,
};

/// A manifest of checkpoint `id` with one state file of vertex `a` per
/// chain (subtask = its index), a diff when its chain is longer than one.
pub(super) fn manifest(id: CheckpointId, savepoint: bool, chains: &[&[CheckpointId]]) -> Manifest {
    let files = chains
        .iter()
        .enumerate()
        .map(|(s, chain)| {
            let task = TaskId {
                vertex: "a".into(),
                subtask: s,
            };
            let base = (chain.len() > 1).then(|| chain[chain.len() - 2]);
            FileEntry {
                chain: chain.to_vec(),
                ..state_entry(&task, Some("k".into()), base, NOTHING)
            }
        })
        .collect();
    build_manifest(
        ManifestMeta {
            checkpoint_id: id,
            savepoint,
            ..Default::default()
        },
        Vec::new(),
        files,
    )
}
