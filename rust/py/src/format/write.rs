//! Writing a checkpoint: its files encoded with their manifest entries, the
//! manifest built, and which checkpoints retention deletes.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use pyo3_arrow::input::AnyRecordBatch;
use snapcut_core::snapshot::TaskId;
use snapcut_core::state::runs::Run;
use snapcut_core::state::DELETED_COLUMN;
use snapcut_core::store::format::{self, ManifestMeta};
use snapcut_core::store::{self, FileEntry, RunEntry};
use snapcut_core::Error;

use super::io::Io;
use super::{entry_dict, task};
use crate::errors::IntoPyResult;
use crate::pyjson::from_py;
use crate::state::StateRuns;

/// Top-level or entry fields of a writer (a JSON object), empty when None.
type Fields = serde_json::Map<String, serde_json::Value>;

fn fields_of(fields: Option<&Bound<'_, PyDict>>, what: &str) -> PyResult<Fields> {
    fields.map_or_else(|| Ok(Fields::new()), |f| from_py(f.as_any(), what))
}

/// An encoded file as a `pyarrow.Buffer` over the same memory, no copy: a
/// state file is as large as the state, and a copy into a Python `bytes`
/// would hold it twice while it is written.
fn file_buffer(py: Python<'_>, bytes: Vec<u8>) -> PyResult<Bound<'_, PyAny>> {
    // (A Vec becomes an Arrow buffer as it is; pyarrow imports it through
    // the C data interface and keeps it alive as long as the Buffer.)
    let array = arrow_array::UInt8Array::from(bytes);
    crate::state::array_to_pyarrow(py, std::sync::Arc::new(array))?
        .call_method0("buffers")?
        .get_item(1)
}

/// What a state file is written from: a table (any pyarrow batch or table,
/// one batch once joined), or a capture's runs
/// (`StateTable.checkpoint_streamed`), merged as the file is written.
enum StateRows {
    Batch(RecordBatch),
    Runs {
        runs: Vec<Arc<Run>>,
        base: bool,
        schema: SchemaRef,
    },
}

/// Where a file written by a writer that keeps its base's lineage stands:
/// its checkpoint id and the base's chain (`chain_at`: format 1) or the
/// base's runs, newest first (`runs_at`: format 2). The entry then carries
/// its own chain, or runs and chain.
enum Lineage {
    Chain(u64, Vec<u64>),
    Runs(u64, Vec<RunEntry>),
}

impl Lineage {
    fn of(
        chain_at: Option<(u64, Vec<u64>)>,
        runs_at: Option<(u64, Bound<'_, PyAny>)>,
    ) -> PyResult<Option<Self>> {
        match (chain_at, runs_at) {
            (Some(_), Some(_)) => Err(crate::errors::ConfigError::new_err(
                "a state file takes chain_at (format 1) or runs_at (format 2), not both",
            )),
            (Some((id, chain)), None) => Ok(Some(Self::Chain(id, chain))),
            (None, Some((id, runs))) => Ok(Some(Self::Runs(
                id,
                from_py(&runs, "runs_at's base runs (a list of run entries)")?,
            ))),
            (None, None) => Ok(None),
        }
    }

    /// The checkpoint the base's state is at: a diff's base.
    fn base(&self) -> Option<u64> {
        match self {
            Self::Chain(_, chain) => chain.last().copied(),
            Self::Runs(_, runs) => runs.first().map(RunEntry::state_at),
        }
    }

    /// Gives `entry` (sizes filled in) its chain, or its runs and chain.
    fn apply(&self, entry: &mut FileEntry) {
        let diff = entry.kind == Some(store::FileKind::Diff);
        match self {
            Self::Chain(id, base) => {
                entry.chain = format::chain_after(*id, diff.then_some(base.as_slice()));
            }
            Self::Runs(id, base) => {
                entry.runs = format::runs_after(*id, entry, None, Some(base));
                entry.chain = format::runs_chain(&entry.runs);
            }
        }
    }
}

/// A state file's rows, whether it is a diff (checked against them), and
/// its base: `base`, else the state the lineage a writer keeps is at.
fn state_input(
    rows: &Bound<'_, PyAny>,
    kind: &str,
    base: Option<u64>,
    lineage: Option<&Lineage>,
) -> PyResult<(StateRows, bool, Option<u64>)> {
    let base = base.or_else(|| lineage.and_then(Lineage::base));
    let diff = match (kind, base) {
        ("full", _) => false,
        ("diff", Some(_)) => true,
        ("diff", None) => {
            return Err(crate::errors::SnapshotError::new_err(format!(
                "a diff needs a base id and a boolean '{DELETED_COLUMN}' column"
            )))
        }
        (other, _) => {
            return Err(crate::errors::SnapshotError::new_err(format!(
                "state kind must be 'full' or 'diff', got '{other}'"
            )))
        }
    };
    if let Ok(runs) = rows.cast::<StateRuns>() {
        let runs = runs.get();
        if runs.base == diff {
            return Err(crate::errors::SnapshotError::new_err(format!(
                "a {} capture's runs cannot be written as a {kind}: write them as the \
                 checkpoint_streamed() that made them said",
                if runs.base { "full" } else { "diff" },
            )));
        }
        let rows = StateRows::Runs {
            runs: runs.runs.clone(),
            base: runs.base,
            schema: runs.schema.clone(),
        };
        return Ok((rows, diff, base));
    }
    let join = crate::state::one_batch(rows.extract::<AnyRecordBatch>()?)?;
    Ok((StateRows::Batch(join()?), diff, base))
}

/// A task's state file entry, its sizes (and lineage) still to fill in by
/// whoever encodes it.
fn new_state_entry(t: &TaskId, key: &str, diff: bool, base: Option<u64>) -> FileEntry {
    format::state_entry(
        t,
        Some(key.into()),
        base.filter(|_| diff),
        format::Written {
            rows: 0,
            bytes: 0,
            crc32c: 0,
        },
    )
}

/// A task's state table as stored (key named, sorted if `sort`).
fn state_file(
    batch: &RecordBatch,
    key: &str,
    diff: bool,
    sort: bool,
) -> Result<RecordBatch, Error> {
    let batch = format::state_batch(batch, key, diff)?;
    if sort {
        format::sort_by_key(&batch, key)
    } else {
        Ok(batch)
    }
}

/// A diff's stored filter (format 3): its bytes, named in `entry`; none
/// for a full or an empty diff.
fn state_filter(
    batch: &RecordBatch,
    key: &str,
    entry: &mut FileEntry,
) -> Result<Option<Vec<u8>>, Error> {
    if entry.kind != Some(store::FileKind::Diff) {
        return Ok(None);
    }
    let bytes = format::diff_filter(std::slice::from_ref(batch), key)?;
    entry.filter = bytes
        .as_deref()
        .map(|b| format::filter_entry(&entry.path, b));
    Ok(bytes)
}

/// Writes the state file of `entry` (and its filter or time index, if
/// any) into `dir` under their names plus `tmp_suffix`, fsynced; all are
/// removed again if the write fails. Fills in the entry's sizes, filter
/// and time index.
fn write_state_files(
    dir: &std::path::Path,
    tmp_suffix: &str,
    rows: StateRows,
    key: &str,
    sort: bool,
    direct_io: bool,
    entry: &mut FileEntry,
) -> Result<(), Error> {
    let diff = entry.kind == Some(store::FileKind::Diff);
    let fsync = store::Fsync::new(store::FsyncMode::PerFile).with_direct_io(direct_io);
    let tmp = dir.join(format!("{}{tmp_suffix}", entry.path));
    let filter_tmp = |entry: &FileEntry| {
        (entry.filter.as_ref()).map(|f| dir.join(format!("{}{tmp_suffix}", f.path)))
    };
    let written = match rows {
        StateRows::Batch(batch) => {
            let batch = state_file(&batch, key, diff, sort)?;
            let filter = state_filter(&batch, key, entry)?;
            (filter_tmp(entry).zip(filter))
                .map_or(Ok(()), |(path, bytes)| {
                    store::write_file(&path, &bytes, &fsync)
                })
                .and_then(|()| store::write_ipc(&tmp, &batch.schema(), &[batch], &fsync))
        }
        StateRows::Runs { runs, base, schema } => {
            // Sorted by construction: a merge of sorted runs.
            let schema = format::state_schema(&schema, key, diff)?;
            store::write_state_runs(&tmp, dir, &runs, base, schema, key, &fsync).and_then(
                |(written, filter)| {
                    entry.filter =
                        (filter.as_deref()).map(|b| format::filter_entry(&entry.path, b));
                    (filter_tmp(entry).zip(filter))
                        .map_or(Ok(()), |(path, bytes)| {
                            store::write_file(&path, &bytes, &fsync)
                        })
                        .map(|()| written)
                },
            )
        }
    };
    // A full of a table with a time index: the index beside it (format 5),
    // read from the file just written.
    let times_tmp = dir.join(format!(
        "{}{tmp_suffix}",
        store::times_file_name(&entry.path)
    ));
    let stored = written.and_then(|w| {
        let times = match diff {
            true => None,
            false => store::write_times(&tmp, &entry.path, &times_tmp, dir, key, &fsync)?,
        };
        Ok((w, times))
    });
    let (w, times) = stored.inspect_err(|_| {
        for path in filter_tmp(entry).iter().chain([&tmp, &times_tmp]) {
            let _ = std::fs::remove_file(path);
        }
    })?;
    (entry.rows, entry.bytes, entry.crc32c) = (w.rows, w.bytes, w.crc32c);
    entry.times = times;
    Ok(())
}

/// A task's state file: `(buffer, entry, filter)`, the bytes a
/// `pyarrow.Buffer` (see [`file_buffer`]), `filter` the bytes of a diff's
/// bloom filter to store beside it as the entry's `filter` names it (None
/// for a full or an empty diff). `batch`: a table; the `StateRuns` of
/// `StateTable.checkpoint_streamed` are refused (their point is a file
/// written as they merge, never the bytes in memory: [`write_state_file`]).
/// `kind` "full", or "diff" against `base`; `sort` orders the rows by `key`
/// (deterministic bytes). A full's time index (format 5) is not made here
/// (its point is a file read as it is written): [`write_state_file`] writes
/// it. With `chain_at` (`(checkpoint id, the base's
/// chain)`, the chain a writer keeps) the entry carries its chain, and a
/// diff's base is the chain's last; with `runs_at` (`(checkpoint id, the
/// base's runs)`, newest first, as entries list them) it carries its runs
/// (format 2: itself, then the base's for a diff) and their chain, and a
/// diff's base is the state the newest base run is at.
#[pyfunction]
#[pyo3(signature = (vertex, subtask, batch, key, kind = "full", base = None, sort = false, chain_at = None, runs_at = None))]
#[allow(clippy::too_many_arguments)]
fn encode_state<'py>(
    py: Python<'py>,
    vertex: &str,
    subtask: usize,
    batch: &Bound<'py, PyAny>,
    key: &str,
    kind: &str,
    base: Option<u64>,
    sort: bool,
    chain_at: Option<(u64, Vec<u64>)>,
    runs_at: Option<(u64, Bound<'py, PyAny>)>,
) -> PyResult<EncodedState<'py>> {
    let lineage = Lineage::of(chain_at, runs_at)?;
    let (rows, diff, base) = state_input(batch, kind, base, lineage.as_ref())?;
    let StateRows::Batch(batch) = rows else {
        return Err(crate::errors::ConfigError::new_err(
            "encode_state takes a table, not StateRuns: write a capture's runs with \
             write_state_file, which merges them into the file as it writes it",
        ));
    };
    let t = task(vertex, subtask);
    let (bytes, entry, filter) = py
        .detach(|| {
            let mut entry = new_state_entry(&t, key, diff, base);
            let batch = state_file(&batch, key, diff, sort)?;
            let filter = state_filter(&batch, key, &mut entry)?;
            let (bytes, w) = format::encode_ipc(&batch.schema(), &[batch], &entry.path)?;
            (entry.rows, entry.bytes, entry.crc32c) = (w.rows, w.bytes, w.crc32c);
            if let Some(lineage) = &lineage {
                lineage.apply(&mut entry);
            }
            Ok::<_, Error>((bytes, entry, filter))
        })
        .map_py()?;
    let filter = filter.map(|f| PyBytes::new(py, &f));
    Ok((file_buffer(py, bytes)?, entry_dict(py, &entry)?, filter))
}

/// `(buffer, entry, filter bytes or None)` of [`encode_state`].
type EncodedState<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyBytes>>,
);

/// As [`encode_state`], but encoded straight into a local file: the entry's
/// file name plus `tmp_suffix` in the directory `dir` (created, or
/// replaced, and fsynced; removed again if the write fails). The file's
/// bytes are never held in memory whole, as a state file as large as the
/// state would be, nor, for `StateRuns`, the capture (merged as it is
/// written, its spool files beside it). A diff's filter is written the
/// same way beside it, as the entry's `filter` names it (plus
/// `tmp_suffix`), and a full's time index (format 5: a table with a time
/// index names its column in a full's schema), as the entry's `times`
/// names it. Returns the entry; the caller renames the files into place
/// (their names without the suffix), the filter and time index first.
#[pyfunction]
#[pyo3(signature = (dir, tmp_suffix, vertex, subtask, batch, key, kind = "full", base = None, sort = false, chain_at = None, direct_io = false, runs_at = None))]
#[allow(clippy::too_many_arguments)]
fn write_state_file<'py>(
    py: Python<'py>,
    dir: std::path::PathBuf,
    tmp_suffix: &str,
    vertex: &str,
    subtask: usize,
    batch: &Bound<'py, PyAny>,
    key: &str,
    kind: &str,
    base: Option<u64>,
    sort: bool,
    chain_at: Option<(u64, Vec<u64>)>,
    direct_io: bool,
    runs_at: Option<(u64, Bound<'py, PyAny>)>,
) -> PyResult<Bound<'py, PyAny>> {
    let lineage = Lineage::of(chain_at, runs_at)?;
    let (rows, diff, base) = state_input(batch, kind, base, lineage.as_ref())?;
    let t = task(vertex, subtask);
    let entry = py
        .detach(|| {
            let mut entry = new_state_entry(&t, key, diff, base);
            write_state_files(&dir, tmp_suffix, rows, key, sort, direct_io, &mut entry)?;
            if let Some(lineage) = &lineage {
                lineage.apply(&mut entry);
            }
            Ok::<_, Error>(entry)
        })
        .map_py()?;
    entry_dict(py, &entry)
}

/// Any table as the bytes of an Arrow IPC file: `(bytes, rows, crc32c)`.
#[pyfunction]
fn encode_ipc<'py>(
    py: Python<'py>,
    batch: AnyRecordBatch,
    what: &str,
) -> PyResult<(Bound<'py, PyBytes>, u64, u32)> {
    let (schema, batches) = batches_of(batch, what)?;
    let (bytes, w) = py
        .detach(|| format::encode_ipc(&schema, &batches, what))
        .map_py()?;
    Ok((PyBytes::new(py, &bytes), w.rows, w.crc32c))
}

fn batches_of(
    batch: AnyRecordBatch,
    what: &str,
) -> PyResult<(arrow_schema::SchemaRef, Vec<arrow_array::RecordBatch>)> {
    let schema = batch.schema()?;
    let batches = batch
        .into_reader()?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| crate::errors::ConfigError::new_err(format!("{what}: {e}")))?;
    Ok((schema, batches))
}

/// A channel file of `(vertex, subtask)`, logged from `edge`'s
/// `from_subtask` on input `input`: `(bytes, entry)`.
#[pyfunction]
fn encode_channel<'py>(
    py: Python<'py>,
    vertex: &str,
    subtask: usize,
    edge: &str,
    from_subtask: usize,
    input: usize,
    records: AnyRecordBatch,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyAny>)> {
    let t = task(vertex, subtask);
    let name = store::channel_file_name(&t, edge, from_subtask);
    let (schema, batches) = batches_of(records, &name)?;
    let (bytes, w) = py
        .detach(|| format::encode_ipc(&schema, &batches, &name))
        .map_py()?;
    let entry = format::channel_entry(&t, edge, input, from_subtask, w);
    Ok((PyBytes::new(py, &bytes), entry_dict(py, &entry)?))
}

/// A file of a role the format leaves to its writer (e.g. `"output"`), named
/// `path`, with the writer's own entry `fields`: `(buffer, entry)`, the bytes
/// a `pyarrow.Buffer` (see [`file_buffer`]).
#[pyfunction]
#[pyo3(signature = (table, path, role, fields = None))]
fn encode_file<'py>(
    py: Python<'py>,
    table: AnyRecordBatch,
    path: &str,
    role: &str,
    fields: Option<&Bound<'py, PyDict>>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let fields = fields_of(fields, "manifest entry fields")?;
    let (schema, batches) = batches_of(table, path)?;
    let (bytes, w) = py
        .detach(|| format::encode_ipc(&schema, &batches, path))
        .map_py()?;
    let entry = format::other_entry(path, role, w, fields);
    Ok((file_buffer(py, bytes)?, entry_dict(py, &entry)?))
}

/// The entry of a file of a role the format leaves to its writer, encoded
/// earlier (e.g. the Spark sink's output files, written by executors):
/// `rows`, `bytes` and `crc32c` of those bytes, the writer's own `fields`.
#[pyfunction]
#[pyo3(signature = (path, role, rows, size, crc32c, fields = None))]
fn file_entry<'py>(
    py: Python<'py>,
    path: &str,
    role: &str,
    rows: u64,
    size: u64,
    crc32c: u32,
    fields: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let fields = fields_of(fields, "manifest entry fields")?;
    let written = format::Written {
        rows,
        bytes: size,
        crc32c,
    };
    entry_dict(py, &format::other_entry(path, role, written, fields))
}

/// The manifest of checkpoint `checkpoint_id` and its `sources.arrow`:
/// `(sources bytes, manifest bytes)`. `files`: the entries (the sources
/// entry is added); a state diff without a chain gets it from its base's
/// manifest, whose bytes `manifest_of(id)` gives. `extra`: the manifest's
/// top-level fields of an engine.
#[pyfunction]
#[pyo3(signature = (checkpoint_id, files, manifest_of, tasks, offsets, protocol, graph_fingerprint, savepoint, started_ms, finished_ms, committed_ms, extra))]
#[allow(clippy::too_many_arguments)]
fn build_manifest<'py>(
    py: Python<'py>,
    checkpoint_id: u64,
    files: &Bound<'py, PyAny>,
    manifest_of: &Bound<'py, PyAny>,
    tasks: Vec<(String, usize)>,
    offsets: Vec<(String, usize, u64)>,
    protocol: &str,
    graph_fingerprint: &str,
    savepoint: bool,
    started_ms: u64,
    finished_ms: u64,
    committed_ms: u64,
    extra: &Bound<'py, PyDict>,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let id = checkpoint_id;
    let mut files: Vec<FileEntry> = from_py(files, "manifest file entries")?;
    let extra: Fields = from_py(extra.as_any(), "manifest fields")?;
    let io = Io::new(manifest_of);
    let resolved = format::resolve_chains(id, &mut files, |b| io.manifest(b).ok());
    io.finish(resolved)?;
    let (sources, manifest) = py
        .detach(|| {
            let offsets: BTreeMap<TaskId, u64> = offsets
                .into_iter()
                .map(|(v, s, o)| (task(&v, s), o))
                .collect();
            let tasks: Vec<TaskId> = tasks.into_iter().map(|(v, s)| task(&v, s)).collect();
            let tasks = format::task_entries(&tasks, &offsets, &files);
            let batch = format::sources_batch(&tasks);
            let (sources, w) = format::encode_ipc(&batch.schema(), &[batch], store::SOURCES_FILE)?;
            files.push(format::sources_entry(w));
            let meta = ManifestMeta {
                checkpoint_id: id,
                protocol: protocol.into(),
                started_ms,
                finished_ms,
                committed_ms,
                graph_fingerprint: graph_fingerprint.into(),
                savepoint,
                extra,
            };
            let manifest = format::build_manifest(meta, tasks, files);
            Ok::<_, Error>((sources, format::manifest_bytes(&manifest)))
        })
        .map_py()?;
    Ok((PyBytes::new(py, &sources), PyBytes::new(py, &manifest)))
}

/// THE retention rule over a root (`format::retention_of_root`), from the
/// root's listing (as `scan` takes it, showing the held directories'
/// entries) and `manifest_of(id)`, their manifests' bytes: a dict of
/// `remove` (complete checkpoints to delete, manifest first), `release`
/// (held directories to delete, record first), `hold` (`{id: {"files",
/// "read_by", "demote"}}`: directories to hold, each keeping only `files`)
/// and `removed` (the complete checkpoints removed or held).
#[pyfunction]
fn retention<'py>(
    py: Python<'py>,
    listing: Vec<(String, bool)>,
    manifest_of: &Bound<'py, PyAny>,
    retain: usize,
) -> PyResult<Bound<'py, PyDict>> {
    if retain < 1 {
        return Err(crate::errors::SnapshotError::new_err(
            "retain must be at least 1 completed checkpoint",
        ));
    }
    let entries = || listing.iter().map(|(p, d)| (p.as_str(), *d));
    let scan = format::scan_listing(entries());
    let held = format::held_files(entries(), &scan);
    let io = Io::new(manifest_of);
    let plan = format::retention_of_root(&scan, &held, |id| io.manifest(id), retain);
    let plan = io.finish(Ok(plan))?;
    let out = PyDict::new(py);
    out.set_item("remove", &plan.remove)?;
    out.set_item("release", &plan.release)?;
    out.set_item("removed", plan.removed())?;
    let hold = PyDict::new(py);
    for (id, h) in &plan.hold {
        let d = PyDict::new(py);
        d.set_item("files", h.files.iter().collect::<Vec<_>>())?;
        d.set_item("read_by", h.read_by.iter().collect::<Vec<_>>())?;
        d.set_item("demote", h.demote)?;
        hold.set_item(id, d)?;
    }
    out.set_item("hold", hold)?;
    Ok(out)
}

/// The bytes of checkpoint `checkpoint_id`'s held record
/// (`format::held_record`): the directory holds `files` for `read_by`.
#[pyfunction]
fn held_record<'py>(
    py: Python<'py>,
    checkpoint_id: u64,
    files: Vec<String>,
    read_by: Vec<u64>,
) -> Bound<'py, PyBytes> {
    let record = format::held_record(checkpoint_id, files, read_by);
    PyBytes::new(py, &format::held_bytes(&record))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(encode_state, m)?)?;
    m.add_function(wrap_pyfunction!(write_state_file, m)?)?;
    m.add_function(wrap_pyfunction!(encode_ipc, m)?)?;
    m.add_function(wrap_pyfunction!(encode_channel, m)?)?;
    m.add_function(wrap_pyfunction!(encode_file, m)?)?;
    m.add_function(wrap_pyfunction!(file_entry, m)?)?;
    m.add_function(wrap_pyfunction!(build_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(retention, m)?)?;
    m.add_function(wrap_pyfunction!(held_record, m)?)?;
    Ok(())
}
