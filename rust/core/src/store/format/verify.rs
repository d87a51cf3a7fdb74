//! Checking what a restore relies on: one file's bytes against its entry
//! (size, checksum, then structure), and a whole checkpoint, its bases'
//! state files included, planned from manifests and run through the
//! caller's I/O.

use std::collections::BTreeMap;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_schema::SchemaRef;

use super::chain::{kind_name, state_chain};
use super::encode::{concat, decode_buffer};
use super::entries::filter_file_entry;
use super::runs::check_runs;
use super::times::times_file_entry;
use crate::error::{Error, Result};
use crate::protocol::CheckpointId;
use crate::state::runs::{BloomFilter, Run};
use crate::state::{time_run_schema, DELETED_COLUMN, TIME_KEY, TIME_METADATA};
use crate::store::manifest::{FileEntry, FileKind, FileRole, Manifest, FILTER_ROLE, TIMES_ROLE};

/// Checks a file's bytes against its manifest entry: size, then checksum
/// (`path` names it in errors). A corrupt file is an error, never read.
pub fn check_file(
    entry: &FileEntry,
    bytes: &[u8],
    checkpoint: CheckpointId,
    path: &str,
) -> Result<()> {
    check_file_in_slices(entry, bytes, checkpoint, path, usize::MAX, || {})
}

/// As [`check_file`], the checksum taken `slice` bytes at a time, calling
/// `after_slice` after each: a mapped file's reader lets go of the pages
/// the checksum read as it goes, so checking a file never holds it whole.
pub fn check_file_in_slices(
    entry: &FileEntry,
    bytes: &[u8],
    checkpoint: CheckpointId,
    path: &str,
    slice: usize,
    mut after_slice: impl FnMut(),
) -> Result<()> {
    if bytes.len() as u64 != entry.bytes {
        return Err(Error::Snapshot(format!(
            "checkpoint {checkpoint}: file {path} is {} bytes, the manifest says {}: truncated or overwritten",
            bytes.len(),
            entry.bytes
        )));
    }
    let mut crc = 0;
    for part in bytes.chunks(slice.max(1)) {
        crc = crc32c::crc32c_append(crc, part);
        after_slice();
    }
    if crc != entry.crc32c {
        return Err(Error::Snapshot(format!(
            "checkpoint {checkpoint}: file {path} fails its checksum (crc32c {crc:#010x}, manifest says \
             {:#010x}): corrupt",
            entry.crc32c
        )));
    }
    Ok(())
}

/// The error of a file listed in a manifest but not there.
pub fn missing_file(checkpoint: CheckpointId, path: &str) -> Error {
    Error::Snapshot(format!(
        "checkpoint {checkpoint}: file {path} listed in the manifest is missing"
    ))
}

/// Why a file whose checksum matches still cannot be read as its entry
/// lists it (not an Arrow IPC file, other row count, a state file without
/// its key column, a diff without `__deleted`, a filter that does not
/// parse), or `None`. Other files are checked by checksum only.
pub fn check_structure(entry: &FileEntry, bytes: &[u8]) -> Option<String> {
    if entry.role == FileRole::Other(FILTER_ROLE.into()) {
        return BloomFilter::from_bytes(bytes, "file").err().map(|e| {
            let why = e.to_string();
            let why = why.strip_prefix("snapshot error: file: ").unwrap_or(&why);
            format!("does not read as a bloom filter: {why}")
        });
    }
    if !entry.path.ends_with(".arrow") {
        return None;
    }
    let (schema, batches) = match decode_buffer(Buffer::from(bytes), "file") {
        Ok(decoded) => decoded,
        Err(e) => {
            let why = e.to_string();
            let why = why
                .strip_prefix("snapshot error: file is not a readable Arrow IPC file: ")
                .unwrap_or(&why);
            return Some(format!("does not open as arrow: {why}"));
        }
    };
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    if rows != entry.rows {
        return Some(format!(
            "holds {rows} rows, the manifest says {}",
            entry.rows
        ));
    }
    if entry.role == FileRole::Other(TIMES_ROLE.into()) {
        return stored_times_problem(&schema, &batches);
    }
    if entry.role == FileRole::State {
        if let Some(key) = &entry.key {
            if schema.index_of(key).is_err() {
                return Some(format!("has no key column '{key}'"));
            }
        }
        if entry.kind == Some(FileKind::Diff) && schema.index_of(DELETED_COLUMN).is_err() {
            return Some(format!("is a diff without a '{DELETED_COLUMN}' column"));
        }
    }
    None
}

/// Why a stored time index (format 5) is not one: other columns, no time
/// column named, or entries out of order.
fn stored_times_problem(schema: &SchemaRef, batches: &[RecordBatch]) -> Option<String> {
    if schema.fields() != time_run_schema().fields()
        || !schema.metadata().contains_key(TIME_METADATA)
    {
        return Some(format!(
            "is not a time index (columns '{TIME_KEY}' and '{DELETED_COLUMN}', its time column \
             in '{TIME_METADATA}')"
        ));
    }
    let batch = match concat(schema, batches) {
        Ok(batch) => batch,
        Err(e) => return Some(e.to_string()),
    };
    Run::from_sorted_unfiltered(batch, TIME_KEY, "file")
        .err()
        .map(|_| "holds its entries out of order".to_string())
}

/// What verifying a checkpoint reads, and what is wrong with its structure.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VerifyPlan {
    /// `(checkpoint, index into that checkpoint's manifest files)`, by
    /// checkpoint (oldest first): every file of the checkpoint itself, the
    /// state files of each base its chains need.
    pub files: Vec<(CheckpointId, usize)>,
    /// Files no manifest's `files` lists, as their entries describe them,
    /// with the checkpoint holding each: run files (a compaction's output,
    /// format 2), and the bloom filters stored beside state files and runs
    /// (format 3; role `filter`).
    pub runs: Vec<(CheckpointId, FileEntry)>,
    /// Problems of no single file: an unreadable base manifest, a chain that
    /// does not end with the checkpoint, names a base without state for the
    /// task, or does not start with a full; runs out of order
    /// ([`check_runs`]) or listed unlike the file they name.
    pub problems: Vec<String>,
}

/// Plans the verification of checkpoint `id` (`manifest`), given the
/// manifests of the checkpoints it needs (or why each cannot be read).
pub fn plan_verify(
    id: CheckpointId,
    manifest: &Manifest,
    bases: &BTreeMap<CheckpointId, std::result::Result<Manifest, String>>,
) -> VerifyPlan {
    let mut plan = VerifyPlan::default();
    let get = |cid: CheckpointId| -> Option<&Manifest> {
        if cid == id {
            Some(manifest)
        } else {
            bases.get(&cid).and_then(|m| m.as_ref().ok())
        }
    };
    for base in manifest.needs() {
        if base == id {
            plan.files
                .extend((0..manifest.files.len()).map(|i| (id, i)));
            continue;
        }
        match bases.get(&base) {
            Some(Ok(m)) => plan.files.extend(
                m.files
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.role == FileRole::State)
                    .map(|(i, _)| (base, i)),
            ),
            Some(Err(why)) => plan.problems.push(format!(
                "checkpoint {id} needs base checkpoint {base}: {why}"
            )),
            None => plan.problems.push(format!(
                "checkpoint {id} needs base checkpoint {base}: its manifest was not read"
            )),
        }
    }
    for entry in manifest.files.iter().filter(|f| f.role == FileRole::State) {
        let Some(task) = entry.task() else { continue };
        if !entry.runs.is_empty() {
            plan_runs(id, &task, entry, manifest, &mut plan);
            continue;
        }
        let chain = state_chain(id, entry);
        if chain.last() != Some(&id) {
            plan.problems.push(format!(
                "checkpoint {id}: state of {task} has a chain {chain:?} not ending with {id}"
            ));
            continue;
        }
        for (i, cid) in chain.iter().enumerate() {
            let Some(m) = get(*cid) else { continue }; // reported above
            let Some(f) = m.state_file(&task) else {
                plan.problems.push(format!(
                    "checkpoint {id}: state of {task} needs checkpoint {cid}, which has no state file for it"
                ));
                break;
            };
            let want = if i == 0 {
                FileKind::Full
            } else {
                FileKind::Diff
            };
            let have = f.kind.unwrap_or(FileKind::Full);
            if have != want {
                plan.problems.push(format!(
                    "checkpoint {id}: state of {task} needs a {} state at checkpoint {cid}, which holds a {}",
                    kind_name(want),
                    kind_name(have)
                ));
                break;
            }
        }
    }
    plan_filters(id, manifest, bases, &mut plan);
    plan
}

/// Adds the filter and time index of every state file and run in `plan` to
/// `plan.runs`.
fn plan_filters(
    id: CheckpointId,
    manifest: &Manifest,
    bases: &BTreeMap<CheckpointId, std::result::Result<Manifest, String>>,
    plan: &mut VerifyPlan,
) {
    let owner = |cid: CheckpointId| match bases.get(&cid) {
        Some(Ok(m)) if cid != id => m,
        _ => manifest,
    };
    let sidecars: Vec<(CheckpointId, FileEntry)> = plan
        .files
        .iter()
        .map(|&(cid, i)| (cid, &owner(cid).files[i]))
        .chain(plan.runs.iter().map(|(cid, f)| (*cid, f)))
        .flat_map(|(cid, f)| {
            let task = f.task();
            let filter = (f.filter.as_ref()).map(|x| (cid, filter_file_entry(x, task.as_ref())));
            let times = (f.times.as_ref()).map(|x| (cid, times_file_entry(x, task.as_ref())));
            filter.into_iter().chain(times)
        })
        .collect();
    plan.runs.extend(sidecars);
}

/// The runs of `task`'s state `entry` at `id` (`manifest`) in `plan`:
/// checked in order; a run of this checkpoint against the file its manifest
/// lists, every other run's file added to `plan.runs`, checked against its
/// entry (its directory need not be complete: held, format 4).
fn plan_runs(
    id: CheckpointId,
    task: &crate::snapshot::TaskId,
    entry: &FileEntry,
    manifest: &Manifest,
    plan: &mut VerifyPlan,
) {
    if let Err(e) = check_runs(id, task, &entry.runs) {
        plan.problems.push(match e {
            Error::Snapshot(m) => m,
            e => e.to_string(),
        });
        return;
    }
    for run in &entry.runs {
        let listed = (run.checkpoint == id)
            .then(|| manifest.files.iter().find(|f| f.path == run.path))
            .flatten();
        match listed {
            None => plan
                .runs
                .push((run.checkpoint, run.file_entry(task, entry.key.clone()))),
            Some(f) if (f.rows, f.bytes, f.crc32c) != (run.rows, run.bytes, run.crc32c) => {
                plan.problems.push(format!(
                    "checkpoint {id}: state of {task} lists run {} unlike its manifest's \
                     entry for it (rows, bytes, crc32c)",
                    run.path
                ))
            }
            Some(_) => {}
        }
    }
}

/// Plans the verification of checkpoint `id` reading the manifests it needs
/// through `manifest_of` (the caller's I/O); one that fails to read is a
/// problem of the plan, not an error. Returns the plan and the manifests.
pub fn plan_verify_with(
    id: CheckpointId,
    manifest: &Manifest,
    mut manifest_of: impl FnMut(CheckpointId) -> Result<Manifest>,
) -> (
    VerifyPlan,
    BTreeMap<CheckpointId, std::result::Result<Manifest, String>>,
) {
    let bases: BTreeMap<_, _> = manifest
        .needs()
        .into_iter()
        .filter(|&b| b != id)
        .map(|b| (b, manifest_of(b).map_err(|e| e.to_string())))
        .collect();
    (plan_verify(id, manifest, &bases), bases)
}

/// Verifies checkpoint `id` as a restore relies on it: every manifest it
/// needs, then every file of its plan, through the caller's I/O
/// (`manifest_of`, `check`: read and check one file against its entry). The
/// first failure is the error; one of a base names the base.
pub fn verify_with(
    id: CheckpointId,
    manifest: &Manifest,
    mut manifest_of: impl FnMut(CheckpointId) -> Result<Manifest>,
    mut check: impl FnMut(CheckpointId, &FileEntry) -> Result<()>,
) -> Result<()> {
    let wrap = |needed: CheckpointId, e: Error| {
        if needed == id {
            e
        } else {
            Error::Snapshot(format!(
                "checkpoint {id} needs base checkpoint {needed}: {e}"
            ))
        }
    };
    let mut bases = BTreeMap::new();
    for needed in manifest.needs() {
        if needed != id {
            let m = manifest_of(needed).map_err(|e| wrap(needed, e))?;
            bases.insert(needed, Ok(m));
        }
    }
    let plan = plan_verify(id, manifest, &bases);
    for (cid, i) in plan.files {
        let f = match bases.get(&cid) {
            Some(Ok(m)) => &m.files[i],
            _ => &manifest.files[i],
        };
        check(cid, f).map_err(|e| wrap(cid, e))?;
    }
    for (cid, f) in &plan.runs {
        check(*cid, f).map_err(|e| wrap(*cid, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::format::testing::manifest;
    use crate::store::format::{encode_ipc, sources_batch, sources_entry};
    use crate::store::manifest::TaskEntry;

    #[test]
    fn verify_names_the_base_a_failure_belongs_to() {
        let top = manifest(3, false, &[&[1, 3]]);
        let base = manifest(1, false, &[&[1]]);
        let mut read = Vec::new();
        verify_with(
            3,
            &top,
            |_| Ok(base.clone()),
            |cid, f| {
                read.push((cid, f.path.clone()));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(read.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 3]);
        let err = verify_with(
            3,
            &top,
            |_| Ok(base.clone()),
            |cid, _| Err(missing_file(cid, "x")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("checkpoint 3 needs base checkpoint 1"),
            "{err}"
        );
        let (plan, bases) = plan_verify_with(3, &top, |_| Err(Error::Snapshot("gone".into())));
        assert_eq!(plan.files, vec![(3, 0)]);
        assert!(plan.problems[0].contains("needs base checkpoint 1: snapshot error: gone"));
        assert!(bases[&1].is_err());
    }

    #[test]
    fn a_plan_checks_runs_and_the_run_files_no_manifest_lists() {
        use crate::store::format::{own_run, runs_chain};
        use crate::store::manifest::RunEntry;
        let base = manifest(1, false, &[&[1]]);
        let mut top = manifest(3, false, &[&[1, 3]]);
        let own = own_run(3, &top.files[0], None);
        // A compaction's output adopted at 3, merging the diff of 2.
        let merged = RunEntry {
            path: "a-0.run-2-2.state.arrow".into(),
            merges: vec![2],
            ..own.clone()
        };
        let full = own_run(1, &base.files[0], None);
        top.files[0].runs = vec![own, merged.clone(), full];
        top.files[0].chain = runs_chain(&top.files[0].runs);
        // Runs need no other manifest: 1's directory may be held.
        assert_eq!(top.needs(), vec![3]);
        let bases = BTreeMap::new();
        let plan = plan_verify(3, &top, &bases);
        assert_eq!(plan.problems, Vec::<String>::new());
        assert_eq!(plan.files, vec![(3, 0)]);
        let runs: Vec<(CheckpointId, &str)> = plan
            .runs
            .iter()
            .map(|(c, f)| (*c, f.path.as_str()))
            .collect();
        assert_eq!(
            runs,
            vec![(3, merged.path.as_str()), (1, "a-0.state.arrow")]
        );
        // Runs out of order, or unlike the file the manifest lists, are problems.
        top.files[0].runs.swap(0, 1);
        assert!(plan_verify(3, &top, &bases).problems[0].contains("start with"));
        top.files[0].runs.swap(0, 1);
        top.files[0].runs[0].crc32c = 7;
        assert!(plan_verify(3, &top, &bases).problems[0].contains("unlike"));
    }

    #[test]
    fn encoded_files_check_against_their_entry() {
        let batch = sources_batch(&[TaskEntry {
            vertex: "src".into(),
            subtask: 0,
            source_offset: Some(10),
            alignment_nanos: 0,
            sent_seq: Vec::new(),
            taken_seq: Vec::new(),
        }]);
        let (bytes, written) = encode_ipc(&batch.schema(), &[batch], "sources").unwrap();
        let entry = sources_entry(written);
        assert_eq!(written.rows, 1);
        check_file(&entry, &bytes, 1, "x").unwrap();
        assert_eq!(check_structure(&entry, &bytes), None);
        let mut bad = bytes.clone();
        bad[bytes.len() / 2] ^= 0xFF;
        assert!(check_file(&entry, &bad, 1, "x")
            .unwrap_err()
            .to_string()
            .contains("fails its checksum"));
        assert!(check_structure(&entry, b"not an arrow file")
            .unwrap()
            .starts_with("does not open as arrow"));
    }
}
