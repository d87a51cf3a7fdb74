//! A task's state as sorted runs (format 2). An entry that lists `runs`
//! is rebuilt from them alone, newest first down to a full; an entry that
//! lists none (format 1) is rebuilt from its chain, which implies the same
//! runs: the chain's files, newest first. Every reader walks
//! [`state_links`], so format 1 and 2 roots restore alike.

use std::collections::BTreeMap;

use arrow_array::{Array, RecordBatch};
use serde_json::Value;

use super::chain::{chain_link, diff_chain, link_kind, state_chain};
use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::snapshot::{StateKind, TaskId};
use crate::state::runs::keys::KeyColumn;
use crate::state::runs::KeyRef;
use crate::store::manifest::{FileEntry, FileKind, FileRole, Manifest, RunEntry};

/// The file of the state entry `entry` of checkpoint `id` as a run.
pub fn own_run(id: CheckpointId, entry: &FileEntry, key_range: Option<(Value, Value)>) -> RunEntry {
    RunEntry {
        checkpoint: id,
        path: entry.path.clone(),
        kind: entry.kind.unwrap_or(FileKind::Full),
        rows: entry.rows,
        bytes: entry.bytes,
        crc32c: entry.crc32c,
        key_range,
        filter: entry.filter.clone(),
        times: entry.times.clone(),
        merges: vec![id],
    }
}

/// The runs of a state file `entry` written at `id` on top of `base_runs`
/// (its base's runs; `None` for a full): itself, then the base's.
pub fn runs_after(
    id: CheckpointId,
    entry: &FileEntry,
    key_range: Option<(Value, Value)>,
    base_runs: Option<&[RunEntry]>,
) -> Vec<RunEntry> {
    let mut runs = vec![own_run(id, entry, key_range)];
    if entry.kind == Some(FileKind::Diff) {
        runs.extend(base_runs.unwrap_or_default().iter().cloned());
    }
    runs
}

/// The checkpoints whose directories hold `runs`, oldest first: what the
/// entry's `chain` says, so retention keeps them (`Manifest::needs`).
pub fn runs_chain(runs: &[RunEntry]) -> Vec<CheckpointId> {
    let mut ids: Vec<CheckpointId> = runs.iter().map(|r| r.checkpoint).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The runs `task`'s state at `id` is made of (`entry`: its state file
/// there), newest first: those it lists, or those its chain implies, read
/// link by link through `manifest_of` (format 1; no key ranges then).
pub fn runs_of(
    id: CheckpointId,
    task: &TaskId,
    entry: &FileEntry,
    mut manifest_of: impl FnMut(CheckpointId) -> Result<Manifest>,
) -> Result<Vec<RunEntry>> {
    if !entry.runs.is_empty() {
        return Ok(entry.runs.clone());
    }
    let mut runs = Vec::new();
    for cid in state_chain(id, entry).into_iter().rev() {
        let link = if cid == id {
            entry.clone()
        } else {
            chain_link(id, task, cid, &manifest_of(cid)?)?.clone()
        };
        let kind = match link_kind(cid, &link)? {
            StateKind::Full => FileKind::Full,
            StateKind::Diff { .. } => FileKind::Diff,
        };
        runs.push(RunEntry {
            kind,
            ..own_run(cid, &link, None)
        });
    }
    Ok(runs)
}

/// Checks the runs of `task`'s state at `id`: a full last and only last,
/// each run's state older than the one before it, the newest at `id`.
pub fn check_runs(id: CheckpointId, task: &TaskId, runs: &[RunEntry]) -> Result<()> {
    let bad = |why: String| {
        Err(Error::Snapshot(format!(
            "checkpoint {id}: runs of {task} {why}"
        )))
    };
    let Some((oldest, newer)) = runs.split_last() else {
        return bad("are empty".into());
    };
    if oldest.kind != FileKind::Full {
        return bad(format!("end with {}, a diff, not a full", oldest.path));
    }
    if let Some(r) = newer.iter().find(|r| r.kind != FileKind::Diff) {
        return bad(format!("hold {}, a full, above the oldest run", r.path));
    }
    if runs[0].state_at() != id {
        return bad(format!(
            "start with {}, the state at checkpoint {}",
            runs[0].path,
            runs[0].state_at()
        ));
    }
    if let Some(w) = runs
        .windows(2)
        .find(|w| w[0].merges.first() <= w[1].merges.last())
    {
        return bad(format!(
            "overlap: {} merges {:?}, the older {} {:?}",
            w[0].path, w[0].merges, w[1].path, w[1].merges
        ));
    }
    Ok(())
}

/// Gives each state entry of checkpoint `id` without a chain its chain: a
/// full's is `[id]`, a diff's its base's chain then `id` (or, on a base
/// that lists runs, its own file then the base's runs, and their chain), the base's
/// manifest read through `manifest_of` (`None`: not there to be read, and
/// the diff is refused).
pub fn resolve_chains(
    id: CheckpointId,
    files: &mut [FileEntry],
    mut manifest_of: impl FnMut(CheckpointId) -> Option<Manifest>,
) -> Result<()> {
    let mut bases: BTreeMap<CheckpointId, Option<Manifest>> = BTreeMap::new();
    for f in files.iter_mut() {
        if f.role != FileRole::State || !f.chain.is_empty() {
            continue;
        }
        f.chain = match (f.kind, f.base, f.task()) {
            (Some(FileKind::Diff), Some(base), Some(t)) => {
                let m = bases.entry(base).or_insert_with(|| manifest_of(base));
                let chain = diff_chain(id, &t, base, m.as_ref(), |_| true)?;
                // A base listing runs (a compaction adopted there) is
                // built on by runs: its chain alone no longer rebuilds it.
                match m.as_ref().and_then(|m| m.state_file(&t)) {
                    Some(b) if !b.runs.is_empty() => {
                        f.runs = runs_after(id, f, None, Some(&b.runs));
                        runs_chain(&f.runs)
                    }
                    _ => chain,
                }
            }
            _ => vec![id],
        };
    }
    Ok(())
}

/// One file a task's state is rebuilt from, oldest first: in the directory
/// of `checkpoint`, holding the state (a full) or the changes (a diff) up to
/// checkpoint `state_at`.
#[derive(Clone, Debug, PartialEq)]
pub struct StateLink {
    pub checkpoint: CheckpointId,
    pub state_at: CheckpointId,
    /// A diff's base is the previous link's `state_at`.
    pub kind: StateKind,
    /// The file, to be read and checked against.
    pub entry: FileEntry,
}

/// The files that rebuild `task`'s state at `id` (`entry`: its state file
/// there), oldest (a full) first, each diff based on the one before:
/// [`runs_of`], checked ([`check_runs`]).
pub fn state_links(
    id: CheckpointId,
    task: &TaskId,
    entry: &FileEntry,
    manifest_of: impl FnMut(CheckpointId) -> Result<Manifest>,
) -> Result<Vec<StateLink>> {
    let runs = runs_of(id, task, entry, manifest_of)?;
    check_runs(id, task, &runs)?;
    let mut links: Vec<StateLink> = Vec::with_capacity(runs.len());
    for run in runs.iter().rev() {
        let kind = match links.last() {
            None => StateKind::Full,
            Some(prev) => StateKind::Diff {
                base: prev.state_at,
            },
        };
        links.push(StateLink {
            checkpoint: run.checkpoint,
            state_at: run.state_at(),
            kind,
            entry: run.file_entry(task, entry.key.clone()),
        });
    }
    Ok(links)
}

/// A key as a run's `key_range` spells it: a number, a UTF-8 string, or
/// `{"hex": ...}` for other bytes.
pub fn key_json(key: KeyRef<'_>) -> Value {
    match key {
        KeyRef::Int(v) => Value::from(v),
        KeyRef::Bytes(b) => match std::str::from_utf8(b) {
            Ok(s) => Value::from(s),
            Err(_) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                serde_json::json!({ "hex": hex })
            }
        },
    }
}

/// The key range of `batch`'s column `key`, in any row order; `None` when
/// it is empty, holds nulls, or is not of a key type (a state of a type
/// runs do not order).
pub fn key_range(batch: &RecordBatch, key: &str) -> Option<(Value, Value)> {
    let column = batch.column_by_name(key)?;
    if column.null_count() > 0 {
        return None;
    }
    let keys = KeyColumn::new(column.as_ref()).ok()?;
    // Integer keys as a slice (the compiler vectorises min and max): the
    // store takes every capture's range on its way in, ~0.1 ms per 500k
    // keys this way against ~5 ms through `at` (three-shuffle, 1M keys:
    // 1 % of the job's CPU samples).
    match keys {
        KeyColumn::Int64(v) => {
            return Some((Value::from(*v.iter().min()?), Value::from(*v.iter().max()?)))
        }
        KeyColumn::Int32(v) => {
            return Some((Value::from(*v.iter().min()?), Value::from(*v.iter().max()?)))
        }
        KeyColumn::Bytes32 { .. } | KeyColumn::Bytes64 { .. } => {}
    }
    let mut all = (0..keys.len()).map(|i| keys.at(i));
    let first = all.next()?;
    let (min, max) = all.fold((first, first), |(lo, hi), k| (lo.min(k), hi.max(k)));
    Some((key_json(min), key_json(max)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{BinaryArray, Int32Array, Int64Array};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::store::format::state_entry;
    use crate::store::format::testing::{manifest, NOTHING};

    fn task() -> TaskId {
        TaskId {
            vertex: "a".into(),
            subtask: 0,
        }
    }

    #[test]
    fn a_format_1_chain_and_its_runs_give_the_same_links() {
        // Task 0 of `manifest`: full at 1, diffs at 2 and 3.
        let top = manifest(3, false, &[&[1, 2, 3]]);
        let entry = top.files[0].clone();
        let from_chain = state_links(3, &task(), &entry, |cid| {
            Ok(manifest(cid, false, &[&(1..=cid).collect::<Vec<_>>()]))
        })
        .unwrap();
        assert_eq!(
            from_chain
                .iter()
                .map(|l| (l.checkpoint, l.kind))
                .collect::<Vec<_>>(),
            vec![
                (1, StateKind::Full),
                (2, StateKind::Diff { base: 1 }),
                (3, StateKind::Diff { base: 2 })
            ]
        );
        let runs = runs_of(3, &task(), &entry, |cid| {
            Ok(manifest(cid, false, &[&(1..=cid).collect::<Vec<_>>()]))
        })
        .unwrap();
        let listed = FileEntry {
            runs,
            ..entry.clone()
        };
        let from_runs = state_links(3, &task(), &listed, |_| panic!("runs need no manifest"));
        assert_eq!(from_runs.unwrap(), from_chain);
    }

    #[test]
    fn runs_are_checked_and_merged_runs_rebase_the_next_link() {
        let diff = state_entry(&task(), Some("k".into()), Some(2), NOTHING);
        let full = state_entry(&task(), Some("k".into()), None, NOTHING);
        let merged = RunEntry {
            merges: vec![1, 2],
            ..own_run(2, &full, None)
        };
        let runs = runs_after(3, &diff, None, Some(std::slice::from_ref(&merged)));
        assert_eq!(runs_chain(&runs), vec![2, 3]);
        let entry = FileEntry {
            runs: runs.clone(),
            ..diff.clone()
        };
        let links = state_links(3, &task(), &entry, |_| unreachable!()).unwrap();
        assert_eq!(links[1].kind, StateKind::Diff { base: 2 });
        let err = |runs: Vec<RunEntry>| check_runs(3, &task(), &runs).unwrap_err().to_string();
        assert!(err(vec![]).contains("are empty"));
        assert!(err(vec![runs[0].clone()]).contains("a diff, not a full"));
        assert!(err(vec![merged.clone(), merged.clone()]).contains("above the oldest"));
        assert!(err(vec![merged.clone()]).contains("the state at checkpoint 2"));
        let overlapping = RunEntry {
            merges: vec![2, 3],
            ..runs[0].clone()
        };
        assert!(err(vec![overlapping, merged]).contains("overlap"));
    }

    #[test]
    fn key_ranges_of_any_order_and_their_spelling() {
        let batch = |col: Arc<dyn Array>, t: DataType| {
            RecordBatch::try_new(
                Arc::new(Schema::new(vec![Field::new("k", t, true)])),
                vec![col],
            )
            .unwrap()
        };
        let ints = batch(Arc::new(Int64Array::from(vec![5, -2, 9])), DataType::Int64);
        assert_eq!(
            key_range(&ints, "k"),
            Some((Value::from(-2), Value::from(9)))
        );
        assert_eq!(
            key_range(&ints.slice(1, 1), "k"),
            Some((Value::from(-2), Value::from(-2)))
        );
        let small = batch(Arc::new(Int32Array::from(vec![7, 3, -4])), DataType::Int32);
        assert_eq!(
            key_range(&small, "k"),
            Some((Value::from(-4), Value::from(7)))
        );
        let bytes = batch(
            Arc::new(BinaryArray::from_iter_values([&b"b"[..], b"\xff"])),
            DataType::Binary,
        );
        assert_eq!(
            key_range(&bytes, "k"),
            Some((Value::from("b"), serde_json::json!({"hex": "ff"})))
        );
        let none = batch(
            Arc::new(Int64Array::from(vec![Some(1), None])),
            DataType::Int64,
        );
        assert_eq!(key_range(&none, "k"), None);
        assert_eq!(key_range(&ints.slice(0, 0), "k"), None);
    }

    #[test]
    fn chains_resolve_from_the_base_once() {
        let task = TaskId {
            vertex: "a".into(),
            subtask: 0,
        };
        let mut files = vec![
            state_entry(&task, Some("k".into()), Some(4), NOTHING),
            state_entry(
                &TaskId {
                    vertex: "b".into(),
                    subtask: 0,
                },
                Some("k".into()),
                None,
                NOTHING,
            ),
        ];
        let mut reads = 0;
        resolve_chains(5, &mut files, |id| {
            reads += 1;
            Some(manifest(id, false, &[&[3, 4]]))
        })
        .unwrap();
        assert_eq!(
            (files[0].chain.clone(), files[1].chain.clone(), reads),
            (vec![3, 4, 5], vec![5], 1)
        );
        let mut orphan = vec![state_entry(&task, Some("k".into()), Some(4), NOTHING)];
        let err = resolve_chains(5, &mut orphan, |_| None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("take a full capture instead"), "{err}");
    }
}
