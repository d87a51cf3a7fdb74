//! `snapcut.StateTable`: the keyed state table, with Arrow crossing the
//! boundary through the PyCapsule interface (no copies at the boundary).

use std::sync::Arc;

use arrow_array::{new_empty_array, Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, SchemaRef};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyDict, PyString};
use pyo3_arrow::input::{AnyArray, AnyRecordBatch};
use pyo3_arrow::{PyArray, PyDataType, PyRecordBatch, PySchema, PyTable};
use snapcut_core::snapshot::{StateCapture, StateKind};
use snapcut_core::state::runs::{BloomFilter, Pages, Run};
use snapcut_core::state::{
    self, parse_memory, CaptureRows, GroupPrefix, SpillStats, StatePolicy, StateTable as CoreTable,
};
use snapcut_core::store::LocalRuns;

use crate::errors::IntoPyResult;
use crate::format::mapped::MappedFile;

/// A keyed state table with change tracking for incremental checkpoints.
#[pyclass(module = "snapcut._core", name = "StateTable")]
pub struct StateTable {
    pub(crate) inner: CoreTable,
    /// Base of the last checkpoint taken, if it was a diff.
    last_base: Option<u64>,
}

/// A capture left as sorted runs to merge as its state file is written
/// (`StateTable.checkpoint_streamed`): the whole state (a full) or the
/// changes with their tombstones (a diff). Only the snapshot writer reads it.
#[pyclass(module = "snapcut._core", name = "StateRuns", frozen)]
pub struct StateRuns {
    pub(crate) runs: Vec<Arc<Run>>,
    /// A full's runs: merged into a base, tombstones dropped.
    pub(crate) base: bool,
    pub(crate) schema: SchemaRef,
}

#[pymethods]
impl StateRuns {
    /// The columns of the state file (a diff's end with `__deleted`).
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        PySchema::new(self.schema.clone()).into_pyarrow(py)
    }

    /// Rows of the runs, tombstones and keys in several runs counted each
    /// time: at least the rows the merge writes.
    #[getter]
    fn rows_in(&self) -> usize {
        self.runs.iter().map(|r| r.len()).sum()
    }

    fn __repr__(&self) -> String {
        format!(
            "StateRuns({} {}, {} rows in)",
            self.runs.len(),
            if self.runs.len() == 1 { "run" } else { "runs" },
            self.rows_in()
        )
    }
}

/// A memory budget given as bytes (an int) or a size string ("256MB").
pub fn memory_bytes(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(text) = value.cast::<PyString>() {
        return parse_memory(text.to_str()?).map_py();
    }
    value.extract::<usize>().map_err(|_| {
        PyValueError::new_err(format!(
            "state_memory must be bytes (a non-negative int) or a size such as '256MB', got {}",
            value.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        ))
    })
}

/// A spilling table's `SpillStats` as a dict (`StateTable.spill_stats()`,
/// `RunReport.spill`).
pub fn spill_stats_dict<'py>(py: Python<'py>, s: &SpillStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("flushes", s.flushes)?;
    d.set_item("rows_flushed", s.rows_flushed)?;
    d.set_item("bytes_flushed", s.bytes_flushed)?;
    d.set_item("merges", s.merges)?;
    d.set_item("run_probes", s.run_probes)?;
    d.set_item("run_hits", s.run_hits)?;
    d.set_item("runs", s.runs)?;
    d.set_item("memtable_bytes", s.memtable_bytes)?;
    d.set_item("bases_mapped", s.bases_mapped)?;
    d.set_item("diffs_mapped", s.diffs_mapped)?;
    d.set_item("filters_stored", s.filters_stored)?;
    d.set_item("times_stored", s.times_stored)?;
    d.set_item("time_flushes", s.time_flushes)?;
    d.set_item("time_merges", s.time_merges)?;
    d.set_item("time_runs", s.time_runs)?;
    Ok(d)
}

pub fn kind_name(kind: StateKind) -> &'static str {
    match kind {
        StateKind::Full => "full",
        StateKind::Diff { .. } => "diff",
    }
}

/// Reads a key sequence: any Arrow array/chunked array, or a Python sequence
/// converted with the key column's pyarrow type.
fn key_arrays(
    py: Python<'_>,
    schema: &Arc<arrow_schema::Schema>,
    key: &str,
    keys: &Bound<'_, PyAny>,
) -> PyResult<Vec<ArrayRef>> {
    let arrow_like = keys.hasattr("__arrow_c_array__")? || keys.hasattr("__arrow_c_stream__")?;
    let keys = if arrow_like {
        keys.clone()
    } else {
        let pa_schema = PySchema::new(schema.clone()).into_pyarrow(py)?;
        let ty = pa_schema.call_method1("field", (key,))?.getattr("type")?;
        py.import("pyarrow")?.call_method1("array", (keys, ty))?
    };
    let any: AnyArray = keys.extract()?;
    let chunked = any.into_chunked_array()?;
    Ok(chunked.chunks().to_vec())
}

fn batches(batch: AnyRecordBatch) -> PyResult<Vec<RecordBatch>> {
    let reader = batch.into_reader()?;
    reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PyValueError::new_err(format!("reading Arrow input: {e}")))
}

/// A RecordBatch or Table as one batch: its parts, read with the GIL held
/// (zero-copy), and a function that joins them (copying only if there are
/// several), to run with the GIL released.
pub fn one_batch(batch: AnyRecordBatch) -> PyResult<impl FnOnce() -> PyResult<RecordBatch> + Send> {
    let schema = batch.schema()?;
    let mut parts = batches(batch)?;
    Ok(move || {
        if parts.len() == 1 {
            return Ok(parts.pop().expect("one part"));
        }
        arrow_select::concat::concat_batches(&schema, &parts)
            .map_err(|e| PyValueError::new_err(format!("joining the Table's batches: {e}")))
    })
}

/// An Arrow array as a pyarrow Array (through the capsule interface).
pub fn array_to_pyarrow(py: Python<'_>, array: ArrayRef) -> PyResult<Bound<'_, PyAny>> {
    let array = PyArray::from_array_ref(array).into_pyobject(py)?;
    py.import("pyarrow")?.getattr("array")?.call1((array,))
}

/// Chunks of one array as one (copying only if there are several).
pub fn one_array(chunks: Vec<ArrayRef>, data_type: &DataType) -> PyResult<ArrayRef> {
    match chunks.as_slice() {
        [] => Ok(new_empty_array(data_type)),
        [one] => Ok(one.clone()),
        _ => {
            let parts: Vec<&dyn Array> = chunks.iter().map(|c| c.as_ref()).collect();
            arrow_select::concat::concat(&parts)
                .map_err(|e| PyValueError::new_err(format!("joining key chunks: {e}")))
        }
    }
}

#[pymethods]
impl StateTable {
    /// A table of `schema` (pyarrow.Schema) keyed by column `key`; every
    /// `full_every`-th checkpoint is a full one. `group`: a key-typed column
    /// whose rows can be read and deleted together (`lookup_groups`,
    /// `delete_groups`), e.g. the grouping key of a composite key.
    /// `time_column`: an int64 column (ms) whose keys `due` finds in time
    /// order without reading the table (timers, TTL, timeouts).
    /// `group_prefix`: what every key begins with, "value" (the group
    /// column's bytes) or "encoding" (`encode_keys([group])`); a table with a
    /// group and a `state_memory` needs it to find its groups in the runs.
    /// `mapped_memory` (bytes or a size, needs `state_memory`): about the
    /// most of the mapped runs' pages lookups leave resident before they
    /// release them (Rust `StateTable::with_mapped_memory`); default
    /// unbounded (the page cache's to reclaim).
    #[new]
    #[pyo3(signature = (schema, key, full_every = 10, group = None, state_memory = None, spill_dir = None, time_column = None, group_prefix = None, mapped_memory = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        schema: PySchema,
        key: &str,
        full_every: u32,
        group: Option<&str>,
        state_memory: Option<&Bound<'_, PyAny>>,
        spill_dir: Option<std::path::PathBuf>,
        time_column: Option<&str>,
        group_prefix: Option<&str>,
        mapped_memory: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut inner =
            CoreTable::new(schema.into_inner(), key, StatePolicy { full_every }).map_py()?;
        if let Some(column) = group {
            inner = inner.with_group(column).map_py()?;
        }
        if let Some(prefix) = group_prefix {
            inner = inner
                .with_group_prefix(GroupPrefix::parse(prefix).map_py()?)
                .map_py()?;
        }
        if let Some(column) = time_column {
            inner = inner.with_time_index(column).map_py()?;
        }
        match (state_memory, spill_dir) {
            (Some(memory), dir) => {
                let budget = memory_bytes(memory)?;
                // Spark's spark.local.dir defaults to the temp dir too.
                let dir = dir.unwrap_or_else(std::env::temp_dir);
                let runs = LocalRuns::new(&dir).map_py()?;
                inner = inner.with_memory_budget(budget, Box::new(runs)).map_py()?;
            }
            (None, Some(dir)) => {
                return Err(PyValueError::new_err(format!(
                    "spill_dir={} needs state_memory= (a budget past which rows spill there)",
                    dir.display()
                )))
            }
            (None, None) => {}
        }
        if let Some(bytes) = mapped_memory {
            inner = inner.with_mapped_memory(memory_bytes(bytes)?).map_py()?;
        }
        Ok(Self {
            inner,
            last_base: None,
        })
    }

    /// Upserts the rows of a pyarrow RecordBatch or Table by key.
    fn update(&mut self, py: Python<'_>, batch: AnyRecordBatch) -> PyResult<()> {
        let batches = batches(batch)?;
        let inner = &mut self.inner;
        py.detach(|| batches.iter().try_for_each(|b| inner.upsert(b)))
            .map_py()
    }

    /// The rows of the present keys, in the order asked, as a pyarrow Table.
    fn get<'py>(&self, py: Python<'py>, keys: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let schema = self.inner.schema();
        let arrays = key_arrays(py, &schema, self.inner.key_column(), keys)?;
        let inner = &self.inner;
        let out = py
            .detach(|| {
                arrays
                    .iter()
                    .map(|a| inner.get(a.as_ref()))
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_py()?;
        PyTable::try_new(out, schema)?.into_pyarrow(py)
    }

    /// One row per key asked, in the order asked (duplicates included):
    /// `(RecordBatch, BooleanArray present)`; an absent key's row has the
    /// key and nulls elsewhere.
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let schema = self.inner.schema();
        let key = self.inner.key_column();
        let chunks = key_arrays(py, &schema, key, keys)?;
        let key_type = schema
            .field_with_name(key)
            .expect("key in schema")
            .data_type();
        let inner = &self.inner;
        let (batch, present) = py.detach(|| -> PyResult<_> {
            let keys = one_array(chunks, key_type)?;
            inner.lookup(keys.as_ref()).map_py()
        })?;
        Ok((
            PyRecordBatch::new(batch).into_pyarrow(py)?,
            array_to_pyarrow(py, Arc::new(present))?,
        ))
    }

    /// Every row of the asked groups (any Arrow array, or a Python sequence,
    /// of the group column's type): `(RecordBatch, UInt32Array)`, the rows
    /// (groups in the order asked, a group's rows in the order written) and
    /// each row's group position among `groups`.
    fn lookup_groups<'py>(
        &self,
        py: Python<'py>,
        groups: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let (chunks, group_type) = self.group_arrays(py, groups)?;
        let inner = &self.inner;
        let (batch, which) = py.detach(|| -> PyResult<_> {
            let groups = one_array(chunks, &group_type)?;
            inner.lookup_groups(groups.as_ref()).map_py()
        })?;
        Ok((
            PyRecordBatch::new(batch).into_pyarrow(py)?,
            array_to_pyarrow(py, Arc::new(which))?,
        ))
    }

    /// Deletes every row of the asked groups; returns how many rows went.
    fn delete_groups(&mut self, py: Python<'_>, groups: &Bound<'_, PyAny>) -> PyResult<usize> {
        let (chunks, group_type) = self.group_arrays(py, groups)?;
        let inner = &mut self.inner;
        py.detach(|| -> PyResult<_> {
            let groups = one_array(chunks, &group_type)?;
            inner.delete_groups(groups.as_ref()).map_py()
        })
    }

    /// The group column (None without one).
    #[getter]
    fn group(&self) -> Option<String> {
        self.inner.group_column().map(str::to_string)
    }

    /// The time column (None without a time index).
    #[getter]
    fn time_column(&self) -> Option<String> {
        self.inner.time_column().map(str::to_string)
    }

    /// The keys whose time is at or before `threshold` (ms, inclusive), by
    /// time then key, as a pyarrow Array of the key type: found in the time
    /// index, not by reading the table.
    fn due<'py>(&mut self, py: Python<'py>, threshold: i64) -> PyResult<Bound<'py, PyAny>> {
        let inner = &mut self.inner;
        let keys = py.detach(|| inner.due(threshold)).map_py()?;
        array_to_pyarrow(py, keys)
    }

    /// The earliest time in the time index (None: no key has one, or no index).
    fn earliest_time(&mut self, py: Python<'_>) -> PyResult<Option<i64>> {
        let inner = &mut self.inner;
        py.detach(|| inner.earliest_time()).map_py()
    }

    /// Deletes keys (absent ones ignored); returns how many were present.
    fn delete(&mut self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let arrays = key_arrays(py, &self.inner.schema(), self.inner.key_column(), keys)?;
        let inner = &mut self.inner;
        py.detach(|| {
            arrays
                .iter()
                .map(|a| inner.delete(a.as_ref()))
                .sum::<Result<usize, _>>()
        })
        .map_py()
    }

    /// Changes since the last checkpoint as a RecordBatch with `__deleted`.
    fn diff<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = &self.inner;
        let batch = py.detach(|| inner.changes());
        PyRecordBatch::new(batch).into_pyarrow(py)
    }

    /// Takes checkpoint `id` (default: one past the last): returns
    /// `(id, "full" | "diff", RecordBatch)`; a diff is based on the previous checkpoint.
    #[pyo3(signature = (id = None))]
    fn checkpoint<'py>(
        &mut self,
        py: Python<'py>,
        id: Option<u64>,
    ) -> PyResult<(u64, &'static str, Bound<'py, PyAny>)> {
        let id = self.next_id(id);
        let inner = &mut self.inner;
        let capture = py.detach(|| inner.checkpoint(id)).map_py()?;
        self.took(capture.kind);
        Ok((
            id,
            kind_name(capture.kind),
            PyRecordBatch::new(capture.batch).into_pyarrow(py)?,
        ))
    }

    /// As `checkpoint()`, but a table whose runs hold part of its state (a
    /// memory budget, flushed) leaves the capture as `StateRuns`: the runs
    /// that `format.write_state_file` merges as it writes the state file,
    /// never holding the capture whole. Any other
    /// table's capture is the RecordBatch `checkpoint()` returns. The state
    /// file's bytes are the same either way.
    #[pyo3(signature = (id = None))]
    fn checkpoint_streamed<'py>(
        &mut self,
        py: Python<'py>,
        id: Option<u64>,
    ) -> PyResult<(u64, &'static str, Bound<'py, PyAny>)> {
        let id = self.next_id(id);
        let inner = &mut self.inner;
        let capture = py.detach(|| inner.checkpoint_streamed(id)).map_py()?;
        self.took(capture.kind);
        let rows = match capture.rows {
            CaptureRows::Batch(batch) => PyRecordBatch::new(batch).into_pyarrow(py)?,
            CaptureRows::Runs { runs, base, schema } => {
                Bound::new(py, StateRuns { runs, base, schema })?.into_any()
            }
        };
        Ok((id, kind_name(capture.kind), rows))
    }

    /// The last checkpoint was aborted: the next one will be full.
    fn checkpoint_aborted(&mut self) {
        self.inner.checkpoint_aborted();
    }

    /// For several checkpoints in flight: from now on a diff is based on the
    /// last checkpoint confirmed with `checkpoint_committed(id)` (see
    /// `last_base`), not on the last one taken, and carries every change since.
    fn confirm_bases(&mut self) {
        self.inner.confirm_bases();
    }

    /// Checkpoint `id` completed: later diffs may be based on it.
    fn checkpoint_committed(&mut self, id: u64) {
        self.inner.checkpoint_committed(id);
    }

    /// The checkpoint the last diff `checkpoint()` returned is based on
    /// (None after a full one).
    #[getter]
    fn last_base(&self) -> Option<u64> {
        self.last_base
    }

    /// Replaces the contents with the state at the end of `chain`, a sequence
    /// of `(id, kind, RecordBatch)` as returned by `checkpoint()`: one full,
    /// then the diffs that follow it. `mapped=True`: the batches are mapped
    /// files no one writes again (a root's state files read through
    /// `pyarrow.memory_map`); a table then takes a sorted full as its base
    /// run as it is, with no copy, and the sorted diffs after it as runs,
    /// with or without a memory budget (without one it is opened lazily:
    /// no rebuild in memory; its memtable has no limit).
    ///
    /// `filters`: per chain entry, the bytes of the bloom filter stored
    /// beside its file (checked against its entry already), or None; a
    /// mapped diff's run takes it instead of hashing its keys.
    ///
    /// `pages`: with `mapped=True`, per chain entry the `MappedFile` its
    /// batch was read from, or None: the table's runs keep its pages and
    /// release what reads bring into the resident set
    /// (:meth:`release_pages`, and within a memory budget as lookups go).
    ///
    /// `times`: the time index stored beside the chain's full (format 5,
    /// checked against its entry already; with `mapped=True` a mapped file
    /// no one writes again), or None: a table indexed by its column takes
    /// it as its index's base run instead of reading every row's time.
    #[pyo3(signature = (chain, *, mapped = false, filters = None, pages = None, times = None))]
    fn restore(
        &mut self,
        py: Python<'_>,
        chain: Vec<(u64, String, AnyRecordBatch)>,
        mapped: bool,
        filters: Option<Vec<Option<PyBackedBytes>>>,
        pages: Option<Vec<Option<PyRef<'_, MappedFile>>>>,
        times: Option<AnyRecordBatch>,
    ) -> PyResult<()> {
        let mut times = match times {
            Some(t) => Some(one_batch(t)?().map_err(|e| {
                PyValueError::new_err(format!("the full's time index: {}", e.value(py)))
            })?),
            None => None,
        };
        let pages: Option<Vec<Option<Arc<dyn Pages>>>> = match pages {
            Some(_) if !mapped => {
                return Err(crate::errors::ConfigError::new_err(
                    "restore got pages without mapped=True: pages are those of mapped files; \
                     pass mapped=True, or no pages",
                ))
            }
            Some(p) if p.len() != chain.len() => {
                return Err(crate::errors::ConfigError::new_err(format!(
                    "restore got {} pages for a chain of {} files; pass one MappedFile (or \
                     None) per file",
                    p.len(),
                    chain.len()
                )))
            }
            Some(p) => Some(
                p.iter()
                    .map(|m| m.as_ref().and_then(|m| m.pages()))
                    .collect(),
            ),
            None => None,
        };
        let filters = match filters {
            Some(f) if f.len() != chain.len() => {
                return Err(crate::errors::ConfigError::new_err(format!(
                    "restore got {} filters for a chain of {} files; pass one (or None) per file",
                    f.len(),
                    chain.len()
                )))
            }
            Some(f) => f,
            None => chain.iter().map(|_| None).collect(),
        };
        let mut captures = Vec::with_capacity(chain.len());
        let mut prev: Option<u64> = None;
        for ((id, kind, batch), filter) in chain.into_iter().zip(filters) {
            let kind = match (kind.as_str(), prev) {
                ("full", _) => StateKind::Full,
                ("diff", Some(base)) => StateKind::Diff { base },
                ("diff", None) => StateKind::Diff { base: 0 },
                (other, _) => {
                    return Err(crate::errors::ConfigError::new_err(format!(
                        "state chain kind must be 'full' or 'diff', got {other:?}"
                    )))
                }
            };
            // A pyarrow Table (several chunks) is accepted as well as a batch.
            let batch = one_batch(batch)?().map_err(|e| {
                PyValueError::new_err(format!("state chain entry {id}: {}", e.value(py)))
            })?;
            let what = format!("state chain entry {id}'s filter");
            let filter = filter
                .map(|f| BloomFilter::from_bytes(&f, &what).map(Arc::new))
                .transpose()
                .map_py()?;
            let times = match kind {
                StateKind::Full => times.take(),
                StateKind::Diff { .. } => None,
            };
            captures.push((
                id,
                StateCapture {
                    kind,
                    batch,
                    filter,
                    times,
                },
            ));
            prev = Some(id);
        }
        let inner = &mut self.inner;
        py.detach(|| {
            if let Some(pages) = &pages {
                inner.restore_mapped_with_pages(&captures, pages)
            } else if mapped {
                inner.restore_mapped(&captures)
            } else {
                inner.restore(&captures)
            }
        })
        .map_py()
    }

    /// Lets go of the pages of the table's mapped runs (its spilled runs,
    /// the files of a mapped restore) that reads brought into this
    /// process's resident set: a table put aside then holds only its
    /// memtable. The page cache keeps them; a later read maps them back.
    fn release_pages(&self, py: Python<'_>) {
        let inner = &self.inner;
        py.detach(|| inner.release_pages());
    }

    /// Every live row as a pyarrow Table.
    fn to_arrow<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = &self.inner;
        let batch = py.detach(|| inner.to_batch());
        PyTable::try_new(vec![batch], self.inner.schema())?.into_pyarrow(py)
    }

    /// The table's pyarrow schema (its metadata names the key column).
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        PySchema::new(self.inner.schema()).into_pyarrow(py)
    }

    #[getter]
    fn key(&self) -> String {
        self.inner.key_column().to_string()
    }

    #[getter]
    fn full_every(&self) -> u32 {
        self.inner.policy().full_every
    }

    #[getter]
    fn last_checkpoint(&self) -> Option<u64> {
        self.inner.last_checkpoint()
    }

    /// Number of keys changed since the last checkpoint (upper bound).
    #[getter]
    fn changed(&self) -> usize {
        self.inner.changed_len()
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// The memory budget in bytes (`None`: unbounded).
    #[getter]
    fn state_memory(&self) -> Option<usize> {
        self.inner.memory_budget()
    }

    /// What spilling did so far (`None` for a table that holds everything in
    /// memory: no memory budget, not opened lazily by a mapped restore): flushes,
    /// rows and bytes flushed, merges, run probes and hits, runs, and the
    /// memtable's estimated bytes.
    fn spill_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.inner
            .spill_stats()
            .map(|s| spill_stats_dict(py, &s))
            .transpose()
    }

    /// Moves the in-memory rows into a run now (needs `state_memory`).
    fn flush(&mut self, py: Python<'_>) -> PyResult<()> {
        let inner = &mut self.inner;
        py.detach(|| inner.flush()).map_py()
    }

    fn __repr__(&self) -> String {
        format!(
            "StateTable(key={:?}, len={}, changed={}, last_checkpoint={:?})",
            self.inner.key_column(),
            self.inner.len(),
            self.inner.changed_len(),
            self.inner.last_checkpoint()
        )
    }
}

impl StateTable {
    /// A checkpoint's id: `id`, or one past the last.
    fn next_id(&self, id: Option<u64>) -> u64 {
        id.unwrap_or_else(|| self.inner.last_checkpoint().map_or(1, |l| l + 1))
    }

    /// A checkpoint of `kind` was taken: `last_base` says what it diffs on.
    fn took(&mut self, kind: StateKind) {
        self.last_base = match kind {
            StateKind::Diff { base } => Some(base),
            StateKind::Full => None,
        };
    }

    fn group_arrays(
        &self,
        py: Python<'_>,
        groups: &Bound<'_, PyAny>,
    ) -> PyResult<(Vec<ArrayRef>, DataType)> {
        let schema = self.inner.schema();
        let Some(column) = self.inner.group_column() else {
            return Err(crate::errors::ConfigError::new_err(
                "this state table has no group column: create it with StateTable(..., group=column)",
            ));
        };
        let group_type = schema
            .field_with_name(column)
            .expect("group column in schema")
            .data_type()
            .clone();
        Ok((key_arrays(py, &schema, column, groups)?, group_type))
    }
}

/// Whether a StateTable column holds `data_type` (a pyarrow DataType) natively.
#[pyfunction]
fn storable_type(data_type: PyDataType) -> bool {
    state::storable_type(data_type.as_ref())
}

/// A state memory budget in bytes, from bytes or a size ("256MB"):
/// ConfigError unless it parses and is at least 1 MiB.
#[pyfunction]
fn state_memory_bytes(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    state::check_memory_budget(memory_bytes(value)?).map_py()
}

/// A size in bytes, as `state_memory_bytes` reads one, with no minimum
/// (the run cache's size limit).
#[pyfunction]
fn size_bytes(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    memory_bytes(value)
}

/// Each key's bucket among `buckets` (a pyarrow uint32 array): every row of
/// a key gets the same bucket, in every process (the runs' filter hash).
/// ConfigError on a null key, a non-key type or 0 buckets.
#[pyfunction]
fn key_buckets<'py>(py: Python<'py>, keys: AnyArray, buckets: u32) -> PyResult<Bound<'py, PyAny>> {
    let chunked = keys.into_chunked_array()?;
    let array = one_array(chunked.chunks().to_vec(), chunked.data_type())?;
    let out = py
        .detach(|| state::runs::key_buckets(array.as_ref(), buckets))
        .map_py()?;
    array_to_pyarrow(py, Arc::new(arrow_array::UInt32Array::from(out)))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<StateTable>()?;
    m.add_class::<StateRuns>()?;
    m.add_function(wrap_pyfunction!(key_buckets, m)?)?;
    m.add_function(wrap_pyfunction!(state_memory_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(size_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(storable_type, m)?)
}
