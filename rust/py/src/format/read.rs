//! Reading a root: its listing, a manifest's checks and summary, the files
//! it lists (state, channels, an export's parts) and a task's state rebuilt
//! from its chain.

use pyo3::prelude::*;
use pyo3_arrow::input::AnyRecordBatch;
use snapcut_core::snapshot::StateKind;
use std::collections::BTreeMap;

use snapcut_core::store::format::DirState;
use snapcut_core::store::{format, FileKind};

use super::io::Io;
use super::{entry_dict, table, task};
use crate::errors::IntoPyResult;

/// Checks a manifest's bytes (JSON, format name and version, checkpoint id).
#[pyfunction]
fn check_manifest(py: Python<'_>, data: &[u8], what: &str, checkpoint_id: u64) -> PyResult<()> {
    py.detach(|| format::parse_manifest(data, what, checkpoint_id).map(drop))
        .map_py()
}

/// `(complete ids, partial ids, held ids)` of a root's listing: `[(path
/// relative to the root, is a directory)]` (`format::scan_listing`).
#[pyfunction]
fn scan(listing: Vec<(String, bool)>) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let scan = format::scan_listing(listing.iter().map(|(p, d)| (p.as_str(), *d)));
    let ids = |state: DirState| {
        scan.iter()
            .filter(|(_, s)| **s == state)
            .map(|(id, _)| *id)
            .collect()
    };
    (
        ids(DirState::Complete),
        ids(DirState::Partial),
        ids(DirState::Held),
    )
}

/// `{id: [file names]}` of the held directories of a root's listing (as
/// `scan` takes it; `format::held_files`: the listing must show their
/// entries).
#[pyfunction]
fn held_files(listing: Vec<(String, bool)>) -> BTreeMap<u64, Vec<String>> {
    let entries = || listing.iter().map(|(p, d)| (p.as_str(), *d));
    format::held_files(entries(), &format::scan_listing(entries()))
        .into_iter()
        .map(|(id, files)| (id, files.into_iter().collect()))
        .collect()
}

/// The error of a manifest that is not there: held when its directory
/// exists with a held record (`held`), partial when it exists without, else
/// a checkpoint that does not exist.
#[pyfunction]
#[pyo3(signature = (checkpoint_id, dir, root, dir_exists, held = false))]
fn missing_manifest(
    checkpoint_id: u64,
    dir: &str,
    root: &str,
    dir_exists: bool,
    held: bool,
) -> PyErr {
    let found = match (dir_exists, held) {
        (false, _) => None,
        (true, true) => Some(DirState::Held),
        (true, false) => Some(DirState::Partial),
    };
    crate::errors::to_py(format::missing_manifest(checkpoint_id, dir, root, found))
}

/// A complete checkpoint's summary (`format::summarize`) as a dict.
#[pyfunction]
fn summary<'py>(
    py: Python<'py>,
    manifest: &[u8],
    checkpoint_id: u64,
) -> PyResult<Bound<'py, PyAny>> {
    let m = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    crate::pyjson::to_py(py, &format::summarize(&m))
}

/// Every checkpoint whose manifest a manifest needs (itself included;
/// `Manifest::needs`), ascending.
#[pyfunction]
fn needs(py: Python<'_>, manifest: &[u8], checkpoint_id: u64) -> PyResult<Vec<u64>> {
    py.detach(|| format::parse_manifest(manifest, "manifest", checkpoint_id).map(|m| m.needs()))
        .map_py()
}

/// `[(vertex, subtask, entry)]` of a checkpoint's state files.
#[pyfunction]
fn state_files<'py>(
    py: Python<'py>,
    manifest: &[u8],
    checkpoint_id: u64,
) -> PyResult<Vec<(String, usize, Bound<'py, PyAny>)>> {
    let m = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    format::state_files(&m)
        .map(|(t, f)| Ok((t.vertex, t.subtask, entry_dict(py, f)?)))
        .collect()
}

/// `(input, edge, from_subtask, entry)` of one channel file.
type ChannelFile<'py> = (usize, String, usize, Bound<'py, PyAny>);

/// `[(input, edge, from_subtask, entry)]` of the channel files
/// `(vertex, subtask)` recorded at a checkpoint.
#[pyfunction]
fn channel_files<'py>(
    py: Python<'py>,
    manifest: &[u8],
    checkpoint_id: u64,
    vertex: &str,
    subtask: usize,
) -> PyResult<Vec<ChannelFile<'py>>> {
    let m = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    let t = task(vertex, subtask);
    format::channel_files(&m, &t)
        .map(|f| {
            Ok((
                f.input.unwrap_or_default(),
                f.edge.clone().unwrap_or_default(),
                f.from_subtask.unwrap_or_default(),
                entry_dict(py, f)?,
            ))
        })
        .collect()
}

/// `(table, role, index, (vertex, subtask) or None, entry)` of a part.
type ExportPart<'py> = (
    String,
    String,
    u64,
    Option<(String, usize)>,
    Bound<'py, PyAny>,
);

/// Every part an export of a checkpoint writes (`format::export_plan`).
#[pyfunction]
fn export_plan<'py>(
    py: Python<'py>,
    manifest: &[u8],
    checkpoint_id: u64,
) -> PyResult<Vec<ExportPart<'py>>> {
    let m = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    let plan = format::export_plan(&m).map_py()?;
    plan.into_iter()
        .map(|p| {
            let entry = entry_dict(py, &m.files[p.file])?;
            Ok((
                p.table,
                p.role,
                p.index,
                p.task.map(|t| (t.vertex, t.subtask)),
                entry,
            ))
        })
        .collect()
}

/// `(checkpoint, "full" | "diff", entry, filter, times)`: one link of a
/// state chain, the file `entry` in the directory of `checkpoint`, the
/// entry of the bloom filter stored beside it (format 3; role "filter"),
/// or None, and that of its time index (format 5; role "times"), or None.
type ChainLink<'py> = (
    u64,
    &'static str,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
);

/// The state files that rebuild `(vertex, subtask)`'s state at checkpoint
/// `checkpoint_id` (`manifest`: its manifest bytes), oldest first; None when
/// the manifest holds no state for the task. `manifest_of(id)` returns a
/// base checkpoint's manifest bytes: Python moves the bytes (its errors pass
/// through), the rule is `format::state_links` (a format 2 entry's runs, or
/// a format 1 chain).
#[pyfunction]
fn state_chain<'py>(
    py: Python<'py>,
    checkpoint_id: u64,
    manifest: &[u8],
    vertex: &str,
    subtask: usize,
    manifest_of: &Bound<'py, PyAny>,
) -> PyResult<Option<Vec<ChainLink<'py>>>> {
    let t = task(vertex, subtask);
    let top = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    let Some(entry) = top.state_file(&t) else {
        return Ok(None);
    };
    let io = Io::new(manifest_of);
    let links = format::state_links(checkpoint_id, &t, entry, |cid| io.manifest(cid));
    let links = io.finish(links)?;
    links
        .into_iter()
        .map(|l| {
            let kind = match l.kind {
                StateKind::Full => "full",
                StateKind::Diff { .. } => "diff",
            };
            let filter = match &l.entry.filter {
                Some(f) => Some(entry_dict(
                    py,
                    &format::filter_file_entry(f, l.entry.task().as_ref()),
                )?),
                None => None,
            };
            let times = match &l.entry.times {
                Some(t) => Some(entry_dict(
                    py,
                    &format::times_file_entry(t, l.entry.task().as_ref()),
                )?),
                None => None,
            };
            Ok((l.checkpoint, kind, entry_dict(py, &l.entry)?, filter, times))
        })
        .collect::<PyResult<Vec<_>>>()
        .map(Some)
}

/// Full state from a chain of `(kind, table)`: one "full", then "diff"s.
#[pyfunction]
fn rebuild_state<'py>(
    py: Python<'py>,
    chain: Vec<(String, AnyRecordBatch)>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut links = Vec::with_capacity(chain.len());
    for (kind, batch) in chain {
        let kind = match kind.as_str() {
            "full" => FileKind::Full,
            "diff" => FileKind::Diff,
            other => {
                return Err(crate::errors::SnapshotError::new_err(format!(
                    "state chain continues with a '{other}' file, expected a diff"
                )))
            }
        };
        links.push((kind, crate::state::one_batch(batch)?));
    }
    let links = links
        .into_iter()
        .map(|(k, join)| Ok((k, join()?)))
        .collect::<PyResult<Vec<_>>>()?;
    let out = py.detach(|| format::rebuild_state(&links)).map_py()?;
    table(py, out)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(check_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(scan, m)?)?;
    m.add_function(wrap_pyfunction!(held_files, m)?)?;
    m.add_function(wrap_pyfunction!(missing_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(summary, m)?)?;
    m.add_function(wrap_pyfunction!(needs, m)?)?;
    m.add_function(wrap_pyfunction!(state_files, m)?)?;
    m.add_function(wrap_pyfunction!(channel_files, m)?)?;
    m.add_function(wrap_pyfunction!(export_plan, m)?)?;
    m.add_function(wrap_pyfunction!(state_chain, m)?)?;
    m.add_function(wrap_pyfunction!(rebuild_state, m)?)?;
    Ok(())
}
