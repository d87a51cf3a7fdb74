//! THE retention rule: which complete checkpoints may be deleted, keeping
//! the newest, the savepoints, and every base a kept or in-progress
//! checkpoint needs; and which directories stay, held, only for the files
//! (runs) kept checkpoints read.

use std::collections::{BTreeMap, BTreeSet};

use super::listing::DirState;
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

/// A directory that stays only for files kept checkpoints read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The files that stay, by name; every other file there goes.
    pub files: BTreeSet<String>,
    /// The kept checkpoints that read them.
    pub read_by: BTreeSet<CheckpointId>,
    /// A complete checkpoint demoted (its held record written, then its
    /// manifest removed), else a held directory trimmed.
    pub demote: bool,
}

/// What retention does to a root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionPlan {
    /// Complete checkpoints nothing kept reads: removed whole, manifest
    /// first (an interrupted removal leaves a partial directory).
    pub remove: Vec<CheckpointId>,
    /// Held directories nothing kept reads any more: removed whole, record
    /// first.
    pub release: Vec<CheckpointId>,
    /// Directories to hold: complete checkpoints demoted and held ones
    /// trimmed (a held directory whose files stay as they are is not here).
    pub hold: BTreeMap<CheckpointId, Hold>,
}

impl RetentionPlan {
    /// The complete checkpoints that stop being restorable: removed or
    /// demoted, ascending.
    pub fn removed(&self) -> Vec<CheckpointId> {
        let mut ids: Vec<CheckpointId> = self
            .remove
            .iter()
            .copied()
            .chain(
                self.hold
                    .iter()
                    .filter(|(_, h)| h.demote)
                    .map(|(id, _)| *id),
            )
            .collect();
        ids.sort_unstable();
        ids
    }

    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.release.is_empty() && self.hold.is_empty()
    }
}

/// THE retention rule. Given the complete checkpoints' manifests, the held
/// directories (`held`: the files each holds now), those in progress, the
/// files other readers read (`reading`: a compaction in flight's inputs)
/// and `retain`: kept whole are the newest `retain` regular (not savepoint)
/// checkpoints, every savepoint, every base of a checkpoint in progress,
/// and, to a fixpoint, every checkpoint a kept one's manifest needs (a
/// format 1 chain, read link by link). Every file a kept checkpoint reads
/// ([`Manifest::reads`]: its runs, wherever they are) stays, with
/// `reading`: a directory of another checkpoint holding some is held (only
/// those files stay), one holding none is removed.
pub fn retention(
    manifests: &BTreeMap<CheckpointId, Manifest>,
    held: &BTreeMap<CheckpointId, BTreeSet<String>>,
    in_progress: &[InProgress],
    reading: &BTreeSet<(CheckpointId, String)>,
    retain: usize,
) -> RetentionPlan {
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
    let mut read: BTreeMap<CheckpointId, Hold> = BTreeMap::new();
    let mut note = |(cid, path): (CheckpointId, String), by: Option<CheckpointId>| {
        let hold = read.entry(cid).or_insert_with(|| Hold {
            files: BTreeSet::new(),
            read_by: BTreeSet::new(),
            demote: false,
        });
        hold.files.insert(path);
        hold.read_by.extend(by);
    };
    for id in &keep {
        for file in manifests.get(id).map(Manifest::reads).unwrap_or_default() {
            note(file, Some(*id));
        }
    }
    for file in reading {
        note(file.clone(), None);
    }
    let mut plan = RetentionPlan::default();
    for id in manifests.keys().filter(|id| !keep.contains(id)) {
        match read.remove(id) {
            Some(hold) => {
                plan.hold.insert(
                    *id,
                    Hold {
                        demote: true,
                        ..hold
                    },
                );
            }
            None => plan.remove.push(*id),
        }
    }
    for (id, files) in held {
        match read.remove(id) {
            None => plan.release.push(*id),
            Some(hold) if &hold.files != files => {
                plan.hold.insert(*id, hold);
            }
            Some(_) => {}
        }
    }
    plan
}

/// [`retention`] over a root as a reader sees it (`scan`: every checkpoint
/// directory and what it is, [`scan_listing`](super::listing::scan_listing);
/// `held`: the files of its held ones,
/// [`held_files`](super::listing::held_files)): the complete checkpoints'
/// manifests read through `manifest_of` (one that fails to read is never a
/// base and is kept for inspection), every partial one in progress with
/// unknown bases.
pub fn retention_of_root(
    scan: &BTreeMap<CheckpointId, DirState>,
    held: &BTreeMap<CheckpointId, BTreeSet<String>>,
    mut manifest_of: impl FnMut(CheckpointId) -> Result<Manifest>,
    retain: usize,
) -> RetentionPlan {
    let manifests: BTreeMap<CheckpointId, Manifest> = scan
        .iter()
        .filter(|(_, s)| **s == DirState::Complete)
        .filter_map(|(&id, _)| Some((id, manifest_of(id).ok()?)))
        .collect();
    let in_progress: Vec<InProgress> = scan
        .iter()
        .filter(|(_, s)| **s == DirState::Partial)
        .map(|(&id, _)| InProgress { id, bases: None })
        .collect();
    retention(&manifests, held, &in_progress, &BTreeSet::new(), retain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::format::testing::manifest;
    use crate::store::manifest::{FileKind, FilterEntry, RunEntry};

    fn none_held() -> BTreeMap<CheckpointId, BTreeSet<String>> {
        BTreeMap::new()
    }

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
        let none = BTreeSet::new();
        // 4 needs 2 and 3; 2 needs 1 (task 1's chain there).
        assert!(retention(&ms, &none_held(), &[], &none, 1).is_empty());
        let mut fewer = ms.clone();
        fewer.insert(5, manifest(5, false, &[&[5], &[5]]));
        let plan = retention(&fewer, &none_held(), &[], &none, 1);
        assert_eq!(
            (plan.remove.clone(), plan.hold.len()),
            (vec![1, 2, 3, 4], 0)
        );
        assert_eq!(plan.removed(), vec![1, 2, 3, 4]);
        let known = InProgress {
            id: 6,
            bases: Some(vec![3]),
        };
        // 3 needs 2 (task 0), which needs 1 (task 1).
        let plan = retention(&fewer, &none_held(), &[known], &none, 1);
        assert_eq!(plan.remove, vec![4]);
        let unknown = InProgress { id: 5, bases: None };
        // Unknown bases: the newest complete checkpoint before it, 4.
        assert!(retention(&fewer, &none_held(), &[unknown], &none, 1).is_empty());
    }

    fn run(checkpoint: CheckpointId, path: &str, merges: &[CheckpointId]) -> RunEntry {
        RunEntry {
            checkpoint,
            path: path.into(),
            kind: if merges.first() == Some(&1) {
                FileKind::Full
            } else {
                FileKind::Diff
            },
            rows: 0,
            bytes: 0,
            crc32c: 0,
            key_range: None,
            filter: (merges.first() != Some(&1)).then(|| FilterEntry {
                path: format!("{path}.bloom"),
                bytes: 0,
                crc32c: 0,
            }),
            times: None,
            merges: merges.to_vec(),
        }
    }

    /// Checkpoint `id` of one task whose state is `runs`, newest first.
    fn with_runs(id: CheckpointId, runs: Vec<RunEntry>) -> (CheckpointId, Manifest) {
        let mut m = manifest(id, false, &[&[id]]);
        let f = &mut m.files[0];
        f.chain = runs.iter().map(|r| r.checkpoint).rev().collect();
        f.runs = runs;
        (id, m)
    }

    #[test]
    fn directories_holding_only_runs_kept_checkpoints_read_are_held() {
        let own = "a-0.state.arrow";
        let merged = "a-0.run-1-3.state.arrow";
        // 1 full, 2 and 3 diffs; 3 adopted a merge of 1..=3; 4 and 5 diffs on it.
        let ms: BTreeMap<_, _> = [
            with_runs(1, vec![run(1, own, &[1])]),
            with_runs(2, vec![run(2, own, &[2]), run(1, own, &[1])]),
            with_runs(3, vec![run(3, merged, &[1, 2, 3])]),
            with_runs(4, vec![run(4, own, &[4]), run(3, merged, &[1, 2, 3])]),
            with_runs(
                5,
                vec![
                    run(5, own, &[5]),
                    run(4, own, &[4]),
                    run(3, merged, &[1, 2, 3]),
                ],
            ),
        ]
        .into_iter()
        .collect();
        let held: BTreeMap<CheckpointId, BTreeSet<String>> = [
            (0, BTreeSet::from(["gone.arrow".to_string()])),
            (4, BTreeSet::from([own.to_string()])),
        ]
        .into();
        let live: BTreeMap<_, _> = ms
            .iter()
            .filter(|(id, _)| **id != 4)
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let plan = retention(&live, &held, &[], &BTreeSet::new(), 1);
        // 5 reads its own file, 4's diff and its filter, and 3's merge: 3 is
        // demoted, 4 stays held with its filter added, 0 is released.
        assert_eq!(plan.remove, vec![1, 2]);
        assert_eq!(plan.release, vec![0]);
        assert_eq!(plan.removed(), vec![1, 2, 3]);
        let h3 = &plan.hold[&3];
        assert!(h3.demote);
        assert_eq!(h3.files, BTreeSet::from([merged.to_string()]));
        assert_eq!(h3.read_by, BTreeSet::from([5]));
        let h4 = &plan.hold[&4];
        assert!(!h4.demote);
        assert_eq!(
            h4.files,
            BTreeSet::from([own.to_string(), format!("{own}.bloom")])
        );
        // A held directory holding what is read stays untouched.
        let held4: BTreeMap<CheckpointId, BTreeSet<String>> = [(4, h4.files.clone())].into();
        let plan = retention(&live, &held4, &[], &BTreeSet::new(), 1);
        assert!(!plan.hold.contains_key(&4) && !plan.release.contains(&4));
        // A compaction in flight reading 2's file holds 2 as well.
        let reading = BTreeSet::from([(2, own.to_string())]);
        let plan = retention(&live, &held4, &[], &reading, 1);
        assert_eq!(plan.remove, vec![1]);
        assert_eq!(plan.hold[&2].files, BTreeSet::from([own.to_string()]));
        assert!(plan.hold[&2].read_by.is_empty());
        // Kept whole, 4 reads 3's merge: with retain 2 only 1 and 2 go.
        let plan = retention(&ms, &none_held(), &[], &BTreeSet::new(), 2);
        assert_eq!(
            (
                plan.remove.clone(),
                plan.hold.keys().copied().collect::<Vec<_>>()
            ),
            (vec![1, 2], vec![3])
        );
    }
}
