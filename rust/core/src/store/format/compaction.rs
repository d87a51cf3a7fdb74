//! Compaction's rules (issue 37): which runs of a task's state to merge,
//! the merge itself, and how a later checkpoint adopts its output. No I/O:
//! the store's compactor thread reads the inputs and writes the output.
//!
//! - A **tier merge** merges the newest diffs into one diff run: the newest
//!   row of a key wins and tombstones stay, since the runs below may still
//!   hold their keys.
//! - A **base merge** merges every run, the full included, into a new full:
//!   tombstones are dropped, nothing below them is left to hide. It is
//!   chosen once the diffs hold more than a quarter of the full's rows, so
//!   the space the diffs take over the state stays bounded.
//!
//! Both are the k-way merge of [`crate::state::runs::merge_rows()`] over the
//! runs' sorted key columns, with no filters: nothing probes the inputs or
//! the output here (a merged diff's stored filter is built from its rows,
//! `format::diff_filter`).

use arrow_array::RecordBatch;

use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::state::runs::{merge_rows, Run};
use crate::store::manifest::{FileKind, FilterEntry, RunEntry, TimesEntry};

/// A base merge is chosen once the diffs' rows exceed the full's rows
/// divided by this.
pub const BASE_MERGE_RATIO: u64 = 4;

/// Which merge a plan is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeKind {
    /// The newest diffs into one diff.
    Tier,
    /// Every run, the full included, into one full.
    Base,
}

/// A compaction of one task's runs: `inputs`, newest first, contiguous in
/// its runs (for a base merge, the runs down to the full).
#[derive(Clone, Debug, PartialEq)]
pub struct CompactionPlan {
    pub kind: MergeKind,
    pub inputs: Vec<RunEntry>,
}

/// The compaction `runs` (newest first, a full last) call for, given
/// `limit` (`StoreOptions::materialize_every`): none while fewer than
/// `limit` diffs sit on the full; then a tier merge of the newest
/// `max(limit, 2)` diffs, or a base merge when the diffs' rows exceed a
/// quarter of the full's or a tier merge would merge just one diff.
pub fn plan_compaction(runs: &[RunEntry], limit: usize) -> Option<CompactionPlan> {
    let (full, diffs) = runs.split_last()?;
    if full.kind != FileKind::Full || diffs.len() < limit.max(1) {
        return None;
    }
    let take = limit.max(2).min(diffs.len());
    let diff_rows: u64 = diffs.iter().map(|r| r.rows).sum();
    let kind = if take < 2 || diff_rows > full.rows / BASE_MERGE_RATIO {
        MergeKind::Base
    } else {
        MergeKind::Tier
    };
    let inputs = match kind {
        MergeKind::Base => runs.to_vec(),
        MergeKind::Tier => runs[..take].to_vec(),
    };
    Some(CompactionPlan { kind, inputs })
}

/// Merges the batches of a plan's inputs (`batches`, newest first, each a
/// state file as stored, in any row order) keyed by `key` into the batch of
/// its output: a diff (`__deleted` last) for a tier merge, a full with the
/// full's schema for a base merge.
pub fn merge_batches(batches: &[RecordBatch], key: &str, kind: MergeKind) -> Result<RecordBatch> {
    let runs = batches
        .iter()
        .map(|b| Run::from_unsorted_unfiltered(b.clone(), key))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&Run> = runs.iter().collect();
    let base = kind == MergeKind::Base;
    let merged = merge_rows(&refs, base)?;
    let Some(full) = batches.last().filter(|_| base) else {
        return Ok(merged);
    };
    // The merge makes value columns nullable (a tombstone has only its
    // key); a full without tombstones keeps the full's own schema, so a
    // restore from it builds the same table as from the full.
    RecordBatch::try_new(full.schema(), merged.columns().to_vec())
        .map_err(|e| Error::Snapshot(format!("a merged full does not fit its full's schema: {e}")))
}

/// The run entry of a plan's output, stored as `path` in the directory of
/// checkpoint `adopter`, with what writing it gave (and what is stored
/// beside it: a diff's filter, a full's time index).
pub fn merged_run(
    plan: &CompactionPlan,
    adopter: CheckpointId,
    path: String,
    written: crate::store::format::Written,
    key_range: Option<(serde_json::Value, serde_json::Value)>,
    filter: Option<FilterEntry>,
    times: Option<TimesEntry>,
) -> RunEntry {
    // A merged run names the span it merged, its first and last checkpoint:
    // every one would grow each manifest entry with the query's age (a base
    // merged at batch 10,000 would list 10,000 ids, in every manifest after),
    // and only the ends are read (the runs' order, the state they rebuild,
    // the output's name). Roots written before list every one; both read alike.
    let (first, last) = merge_span(plan);
    let merges = if first == last {
        vec![first]
    } else {
        vec![first, last]
    };
    RunEntry {
        checkpoint: adopter,
        path,
        kind: match plan.kind {
            MergeKind::Tier => FileKind::Diff,
            MergeKind::Base => FileKind::Full,
        },
        rows: written.rows,
        bytes: written.bytes,
        crc32c: written.crc32c,
        key_range,
        filter,
        times,
        merges,
    }
}

/// The oldest and newest checkpoint a plan's output merges.
pub fn merge_span(plan: &CompactionPlan) -> (CheckpointId, CheckpointId) {
    let ids = plan.inputs.iter().flat_map(|r| r.merges.iter().copied());
    let lo = ids.clone().min().unwrap_or_default();
    (lo, ids.max().unwrap_or_default())
}

/// `runs` with a compaction's `inputs` replaced by its `output`, if they
/// are still there, contiguous and in order (and, for a full output, the
/// oldest runs); `None` when a newer checkpoint superseded them (a full
/// capture, another compaction adopted, a chain rebased), and the output is
/// discarded.
pub fn adopt(runs: &[RunEntry], inputs: &[RunEntry], output: RunEntry) -> Option<Vec<RunEntry>> {
    if inputs.is_empty() {
        return None;
    }
    let at = runs.windows(inputs.len()).position(|w| w == inputs)?;
    let end = at + inputs.len();
    if output.kind == FileKind::Full && end != runs.len() {
        return None;
    }
    let mut adopted = runs[..at].to_vec();
    adopted.push(output);
    adopted.extend_from_slice(&runs[end..]);
    Some(adopted)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::{BooleanArray, Int64Array};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::state::{DELETED_COLUMN, KEY_METADATA};
    use crate::store::format::rebuild_state;

    fn run(checkpoint: CheckpointId, kind: FileKind, rows: u64) -> RunEntry {
        RunEntry {
            checkpoint,
            path: format!("r{checkpoint}"),
            kind,
            rows,
            bytes: 0,
            crc32c: 0,
            key_range: None,
            filter: None,
            times: None,
            merges: vec![checkpoint],
        }
    }

    #[test]
    fn plans_tier_merges_until_the_diffs_outgrow_a_quarter_of_the_full() {
        let full = run(1, FileKind::Full, 1000);
        let diffs = |n: CheckpointId, rows: u64| -> Vec<RunEntry> {
            let mut runs: Vec<_> = (2..2 + n)
                .rev()
                .map(|c| run(c, FileKind::Diff, rows))
                .collect();
            runs.push(full.clone());
            runs
        };
        assert_eq!(plan_compaction(&diffs(2, 10), 3), None);
        let tier = plan_compaction(&diffs(4, 10), 3).unwrap();
        assert_eq!(tier.kind, MergeKind::Tier);
        assert_eq!(
            tier.inputs.iter().map(|r| r.checkpoint).collect::<Vec<_>>(),
            vec![5, 4, 3]
        );
        let base = plan_compaction(&diffs(4, 100), 3).unwrap();
        assert_eq!((base.kind, base.inputs.len()), (MergeKind::Base, 5));
        // A limit of 1 never tier-merges a single diff.
        assert_eq!(
            plan_compaction(&diffs(1, 1), 1).unwrap().kind,
            MergeKind::Base
        );
        // No full at the bottom: nothing to plan against.
        assert_eq!(plan_compaction(&diffs(4, 1)[..4], 3), None);
        assert_eq!(merge_span(&tier), (3, 5));
    }

    #[test]
    fn adoption_needs_the_inputs_in_place() {
        let runs: Vec<_> = vec![
            run(4, FileKind::Diff, 1),
            run(3, FileKind::Diff, 1),
            run(2, FileKind::Diff, 1),
            run(1, FileKind::Full, 1),
        ];
        let tier = CompactionPlan {
            kind: MergeKind::Tier,
            inputs: runs[1..3].to_vec(),
        };
        let out = merged_run(
            &tier,
            5,
            "m".into(),
            crate::store::format::Written {
                rows: 1,
                bytes: 2,
                crc32c: 3,
            },
            None,
            None,
            None,
        );
        assert_eq!((out.merges.clone(), out.kind), (vec![2, 3], FileKind::Diff));
        // Merged again with what came after: still its span's two ends,
        // whatever the history (an entry's size does not grow with it).
        let older = RunEntry {
            merges: vec![0, 1, 2, 3],
            ..out.clone()
        };
        let base = CompactionPlan {
            kind: MergeKind::Base,
            inputs: vec![run(5, FileKind::Diff, 1), run(4, FileKind::Diff, 1), older],
        };
        let written = crate::store::format::Written {
            rows: 1,
            bytes: 2,
            crc32c: 3,
        };
        let again = merged_run(&base, 5, "b".into(), written, None, None, None);
        assert_eq!((again.merges, again.kind), (vec![0, 5], FileKind::Full));
        let adopted = adopt(&runs, &tier.inputs, out.clone()).unwrap();
        assert_eq!(
            adopted.iter().map(|r| r.path.as_str()).collect::<Vec<_>>(),
            vec!["r4", "m", "r1"]
        );
        assert_eq!(
            adopt(&adopted, &tier.inputs, out.clone()),
            None,
            "superseded"
        );
        let full_out = RunEntry {
            kind: FileKind::Full,
            ..out
        };
        assert_eq!(
            adopt(&runs, &tier.inputs, full_out.clone()),
            None,
            "a full only at the bottom"
        );
        assert_eq!(adopt(&runs, &runs[2..], full_out).unwrap().len(), 3);
    }

    fn schema(diff: bool) -> Arc<Schema> {
        let mut fields = vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ];
        if diff {
            fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
        }
        Arc::new(Schema::new_with_metadata(
            fields,
            [(KEY_METADATA.to_string(), "k".to_string())].into(),
        ))
    }

    fn batch(rows: &[(i64, Option<i64>)], diff: bool) -> RecordBatch {
        let mut cols: Vec<Arc<dyn arrow_array::Array>> = vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|r| r.1.unwrap_or(0)),
            )),
        ];
        if diff {
            cols.push(Arc::new(BooleanArray::from_iter(
                rows.iter().map(|r| Some(r.1.is_none())),
            )));
        }
        RecordBatch::try_new(schema(diff), cols).unwrap()
    }

    fn state(b: &RecordBatch) -> BTreeMap<i64, i64> {
        let k = b.column(0).as_primitive::<Int64Type>();
        let v = b.column(1).as_primitive::<Int64Type>();
        (0..b.num_rows())
            .map(|i| (k.value(i), v.value(i)))
            .collect()
    }

    #[test]
    fn merges_restore_what_the_chain_restores() {
        let full = batch(&[(1, Some(10)), (2, Some(20)), (3, Some(30))], false);
        // Unsorted diffs, as tables write them: upserts, then tombstones.
        let d1 = batch(&[(4, Some(40)), (2, Some(21)), (1, None)], true);
        let d2 = batch(&[(1, Some(11)), (4, None)], true);
        let chain = rebuild_state(&[
            (FileKind::Full, full.clone()),
            (FileKind::Diff, d1.clone()),
            (FileKind::Diff, d2.clone()),
        ])
        .unwrap();
        let tier = merge_batches(&[d2.clone(), d1.clone()], "k", MergeKind::Tier).unwrap();
        // Key 4's tombstone stays: the full below does not hold it, but a
        // tier merge cannot know.
        assert_eq!(tier.num_rows(), 3);
        assert_eq!(tier.schema().field(2).name(), DELETED_COLUMN);
        let via_tier =
            rebuild_state(&[(FileKind::Full, full.clone()), (FileKind::Diff, tier)]).unwrap();
        assert_eq!(state(&via_tier), state(&chain));
        let base = merge_batches(&[d2, d1, full.clone()], "k", MergeKind::Base).unwrap();
        assert_eq!(state(&base), state(&chain));
        assert_eq!(
            base.schema(),
            full.schema(),
            "a merged full keeps the full's schema"
        );
        assert!(merge_batches(&[], "k", MergeKind::Tier).is_err());
    }
}
