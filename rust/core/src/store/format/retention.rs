//! THE retention rule: which complete checkpoints may be deleted, keeping
//! the newest, the savepoints, and every base a kept or in-progress
//! checkpoint needs.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::Result;
use crate::protocol::CheckpointId;
use crate::store::manifest::Manifest;

/// A checkpoint being written while retention runs: the bases its state
/// diffs are captured against, when known (the store knows them; a reader of
/// a root sees only a directory without a manifest, and then the newest
/// complete checkpoint older than it is taken as its base).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InProgress {
    pub id: CheckpointId,
    pub bases: Option<Vec<CheckpointId>>,
}

/// THE retention rule. Given the complete checkpoints' manifests, those in
/// progress and `retain`, the complete checkpoints to delete: every one that
/// is not among the newest `retain` regular (not savepoint) checkpoints, not
/// a savepoint, not a base of a checkpoint in progress, and not needed, to a
/// fixpoint, by a kept one (a checkpoint kept as one task's base must
/// restore whole too: another task's chain there may reach further back).
pub fn retention(
    manifests: &BTreeMap<CheckpointId, Manifest>,
    in_progress: &[InProgress],
    retain: usize,
) -> Vec<CheckpointId> {
    let mut keep: BTreeSet<CheckpointId> = manifests
        .values()
        .filter(|m| !m.savepoint)
        .map(|m| m.checkpoint_id)
        .rev()
        .take(retain)
        .collect();
    keep.extend(
        manifests
            .values()
            .filter(|m| m.savepoint)
            .map(|m| m.checkpoint_id),
    );
    for p in in_progress {
        match &p.bases {
            Some(bases) => keep.extend(bases.iter().copied()),
            None => keep.extend(manifests.range(..p.id).next_back().map(|(id, _)| *id)),
        }
    }
    loop {
        let needed: Vec<CheckpointId> = keep
            .iter()
            .filter_map(|id| manifests.get(id))
            .flat_map(Manifest::needs)
            .filter(|id| !keep.contains(id))
            .collect();
        if needed.is_empty() {
            break;
        }
        keep.extend(needed);
    }
    manifests
        .keys()
        .filter(|id| !keep.contains(id))
        .copied()
        .collect()
}

/// [`retention`] over a root as a reader sees it (`scan`: every checkpoint
/// and whether it is complete,
/// [`scan_listing`](super::listing::scan_listing)): the complete
/// checkpoints' manifests read through `manifest_of` (one that fails to read
/// is never a base and is kept for inspection), every partial one in
/// progress with unknown bases.
pub fn retention_of_root(
    scan: &BTreeMap<CheckpointId, bool>,
    mut manifest_of: impl FnMut(CheckpointId) -> Result<Manifest>,
    retain: usize,
) -> Vec<CheckpointId> {
    let manifests: BTreeMap<CheckpointId, Manifest> = scan
        .iter()
        .filter(|(_, complete)| **complete)
        .filter_map(|(&id, _)| Some((id, manifest_of(id).ok()?)))
        .collect();
    let in_progress: Vec<InProgress> = scan
        .iter()
        .filter(|(_, complete)| !**complete)
        .map(|(&id, _)| InProgress { id, bases: None })
        .collect();
    retention(&manifests, &in_progress, retain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::format::testing::manifest;

    #[test]
    fn retention_keeps_bases_to_a_fixpoint_and_those_in_progress() {
        // Task 0: full at 2, diffs 3, 4. Task 1: full at 1, diff 2, full 3, diff 4.
        let ms: BTreeMap<_, _> = [
            manifest(1, false, &[&[1], &[1]]),
            manifest(2, false, &[&[2], &[1, 2]]),
            manifest(3, false, &[&[2, 3], &[3]]),
            manifest(4, false, &[&[2, 3, 4], &[3, 4]]),
        ]
        .into_iter()
        .map(|m| (m.checkpoint_id, m))
        .collect();
        // 4 needs 2 and 3; 2 needs 1 (task 1's chain there).
        assert_eq!(retention(&ms, &[], 1), Vec::<CheckpointId>::new());
        let mut fewer = ms.clone();
        fewer.insert(5, manifest(5, false, &[&[5], &[5]]));
        assert_eq!(retention(&fewer, &[], 1), vec![1, 2, 3, 4]);
        let known = InProgress {
            id: 6,
            bases: Some(vec![3]),
        };
        // 3 needs 2 (task 0), which needs 1 (task 1).
        assert_eq!(retention(&fewer, &[known], 1), vec![4]);
        let unknown = InProgress { id: 5, bases: None };
        // Unknown bases: the newest complete checkpoint before it, 4.
        assert_eq!(retention(&fewer, &[unknown], 1), Vec::<CheckpointId>::new());
    }
}
