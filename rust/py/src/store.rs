//! The local-path snapshot store and reader, for `snapcut.snapshots`.
//! Manifests cross as JSON text (Python parses them with the same schema the
//! pure-Python reader uses); Arrow data crosses through the PyCapsule interface.

use std::sync::Arc;

use std::collections::BTreeMap;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use pyo3_arrow::input::AnyRecordBatch;
use pyo3_arrow::{PyRecordBatch, PyTable};
use snapcut_core::protocol::ProtocolKind;
use snapcut_core::snapshot::{
    ChannelLog, CheckpointMeta, SnapshotSink, StateCapture, StateKind, TaskId, TaskSnapshot,
};
use snapcut_core::state::{DELETED_COLUMN, KEY_METADATA};
use snapcut_core::store::format::{self, ManifestMeta};
use snapcut_core::store::{
    self, FileEntry, FileKind, Manifest, SnapshotReader as CoreReader, SnapshotStore as CoreStore,
    StoreOptions,
};
use snapcut_core::Error;

use crate::errors::{ConfigError, IntoPyResult};

fn task(vertex: &str, subtask: usize) -> TaskId {
    TaskId {
        vertex: vertex.into(),
        subtask,
    }
}

/// `(input, edge, from_subtask, pyarrow.Table)` of one recorded channel.
type ChannelTuple<'py> = (usize, String, usize, Bound<'py, PyAny>);

fn manifest_json(m: &store::Manifest) -> String {
    serde_json::to_string(m).expect("manifest serialises")
}

/// Read access to a local snapshot root.
#[pyclass(module = "snapcut._core", name = "SnapshotReader", frozen)]
pub struct SnapshotReader {
    inner: CoreReader,
}

#[pymethods]
impl SnapshotReader {
    #[new]
    fn new(root: std::path::PathBuf) -> PyResult<Self> {
        Ok(Self {
            inner: CoreReader::open(root).map_py()?,
        })
    }

    /// Ids of complete checkpoints, oldest first.
    fn list(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        py.detach(|| self.inner.list()).map_py()
    }

    /// Ids of partial checkpoint directories (no manifest).
    fn partial(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        py.detach(|| self.inner.partial()).map_py()
    }

    /// The manifest of checkpoint `id` as JSON text.
    fn manifest(&self, py: Python<'_>, id: u64) -> PyResult<String> {
        py.detach(|| self.inner.manifest(id))
            .map(|m| manifest_json(&m))
            .map_py()
    }

    /// Verifies checkpoint `id` (files, sizes, checksums, chain); returns its manifest JSON.
    fn verify(&self, py: Python<'_>, id: u64) -> PyResult<String> {
        py.detach(|| self.inner.verify(id))
            .map(|m| manifest_json(&m))
            .map_py()
    }

    /// `(id, [(skipped_id, reason), ...])` of the newest intact checkpoint.
    fn latest_intact(&self, py: Python<'_>) -> PyResult<(u64, Vec<(u64, String)>)> {
        let (m, skipped) = py.detach(|| self.inner.latest_intact()).map_py()?;
        Ok((
            m.checkpoint_id,
            skipped.into_iter().map(|s| (s.id, s.reason)).collect(),
        ))
    }

    fn next_checkpoint_id(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.inner.next_checkpoint_id()).map_py()
    }

    /// Full state of a task at checkpoint `id` (rebuilt from its chain), or None.
    fn state<'py>(
        &self,
        py: Python<'py>,
        id: u64,
        vertex: &str,
        subtask: usize,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let t = task(vertex, subtask);
        let batch = py.detach(|| self.inner.state(id, &t)).map_py()?;
        batch
            .map(|b| {
                let schema = b.schema();
                PyTable::try_new(vec![b], schema)?.into_pyarrow(py)
            })
            .transpose()
    }

    /// Recorded channels of a task: `[(input, edge, from_subtask, Table), ...]`.
    fn channels<'py>(
        &self,
        py: Python<'py>,
        id: u64,
        vertex: &str,
        subtask: usize,
    ) -> PyResult<Vec<ChannelTuple<'py>>> {
        let t = task(vertex, subtask);
        let logs = py.detach(|| self.inner.channels(id, &t)).map_py()?;
        logs.into_iter()
            .map(|log| {
                let schema = log
                    .records
                    .first()
                    .map_or_else(|| Arc::new(arrow_schema::Schema::empty()), |b| b.schema());
                let table = PyTable::try_new(log.records, schema)?.into_pyarrow(py)?;
                Ok((log.input, log.edge, log.from_subtask, table))
            })
            .collect()
    }
}

/// The durable store on a local path: what the runtime writes through, also
/// drivable from Python (tests, tools).
#[pyclass(module = "snapcut._core", name = "SnapshotStore", frozen)]
pub struct SnapshotStore {
    inner: Arc<CoreStore>,
}

#[pymethods]
impl SnapshotStore {
    #[new]
    #[pyo3(signature = (root, retain = 3, cleanup_partial_on_open = true, materialize_every = None, fsync = "syncfs"))]
    fn new(
        py: Python<'_>,
        root: std::path::PathBuf,
        retain: usize,
        cleanup_partial_on_open: bool,
        materialize_every: Option<usize>,
        fsync: &str,
    ) -> PyResult<Self> {
        let options = StoreOptions {
            retain,
            cleanup_partial_on_open,
            materialize_every,
            fsync: fsync.parse().map_py()?,
        };
        let inner = py.detach(|| CoreStore::open(root, options)).map_py()?;
        Ok(Self { inner })
    }

    /// Stages one task's part of checkpoint `id`. `state` is
    /// `(kind, base, RecordBatch)` with kind "full" or "diff"; `channels` is
    /// `[(input, edge, from_subtask, RecordBatch | Table), ...]`.
    #[pyo3(signature = (id, vertex, subtask, state = None, source_offset = None, channels = Vec::new(), alignment_nanos = 0))]
    #[allow(clippy::too_many_arguments)]
    fn task_snapshot(
        &self,
        py: Python<'_>,
        id: u64,
        vertex: &str,
        subtask: usize,
        state: Option<(String, Option<u64>, PyRecordBatch)>,
        source_offset: Option<u64>,
        channels: Vec<(usize, String, usize, pyo3_arrow::input::AnyRecordBatch)>,
        alignment_nanos: u64,
    ) -> PyResult<()> {
        let state = state
            .map(|(kind, base, batch)| {
                let kind = match (kind.as_str(), base) {
                    ("full", _) => StateKind::Full,
                    ("diff", Some(base)) => StateKind::Diff { base },
                    _ => {
                        return Err(ConfigError::new_err(format!(
                            "state kind must be 'full', or 'diff' with a base id; got {kind:?} with base {base:?}"
                        )))
                    }
                };
                Ok(StateCapture {
                    kind,
                    batch: batch.into_inner(),
                })
            })
            .transpose()?;
        let mut logs = Vec::with_capacity(channels.len());
        for (input, edge, from_subtask, records) in channels {
            let records = records
                .into_reader()?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ConfigError::new_err(format!("channel '{edge}' records: {e}")))?;
            logs.push(ChannelLog {
                input,
                edge,
                from_subtask,
                records,
            });
        }
        let snapshot = TaskSnapshot {
            task: task(vertex, subtask),
            state,
            channels: logs,
            source_offset,
            alignment_nanos,
            sent_seq: Vec::new(),
            taken_seq: Vec::new(),
        };
        py.detach(|| self.inner.task_snapshot(id, snapshot))
            .map_py()
    }

    /// Waits for the staged files and writes the manifest of checkpoint `id`.
    #[pyo3(signature = (id, protocol = "aligned", graph_fingerprint = "", savepoint = false, started_ms = 0, finished_ms = 0))]
    #[allow(clippy::too_many_arguments)]
    fn commit(
        &self,
        py: Python<'_>,
        id: u64,
        protocol: &str,
        graph_fingerprint: &str,
        savepoint: bool,
        started_ms: u64,
        finished_ms: u64,
    ) -> PyResult<()> {
        let protocol: ProtocolKind = protocol.parse().map_py()?;
        let meta = CheckpointMeta {
            id,
            protocol,
            started_ms,
            finished_ms,
            graph_fingerprint: graph_fingerprint.into(),
            savepoint,
        };
        py.detach(|| self.inner.commit(meta)).map_py()
    }

    fn abort(&self, py: Python<'_>, id: u64) -> PyResult<()> {
        py.detach(|| self.inner.abort(id)).map_py()
    }

    /// Ids of completed checkpoints still held.
    fn completed(&self) -> Vec<u64> {
        self.inner.completed()
    }

    #[getter]
    fn root(&self) -> std::path::PathBuf {
        self.inner.root().to_path_buf()
    }
}

/// The format constants shared by the Rust store and the Python reader/writer.
fn format_constants<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("FORMAT_NAME", store::FORMAT_NAME)?;
    d.set_item("FORMAT_VERSION", store::FORMAT_VERSION)?;
    d.set_item("MANIFEST_FILE", store::MANIFEST_FILE)?;
    d.set_item("MANIFEST_TMP_FILE", store::MANIFEST_TMP_FILE)?;
    d.set_item("SOURCES_FILE", store::SOURCES_FILE)?;
    d.set_item("CHECKPOINT_DIR_PREFIX", store::CHECKPOINT_DIR_PREFIX)?;
    d.set_item("DELETED_COLUMN", DELETED_COLUMN)?;
    d.set_item("KEY_METADATA", KEY_METADATA)?;
    Ok(d)
}

/// CRC-32C (Castagnoli) of `data`: the checksum of every snapshot file.
#[pyfunction(name = "crc32c")]
fn crc32c_of(py: Python<'_>, data: &[u8]) -> u32 {
    py.detach(|| ::crc32c::crc32c(data))
}

// --- the format's rules (rust/core/src/store/format.rs), for the Python
// backend that moves the bytes of URI roots. Manifests and entries cross as
// JSON text, files as bytes, tables through the PyCapsule interface.

fn entry_of(json: &str) -> Result<FileEntry, Error> {
    serde_json::from_str(json)
        .map_err(|e| Error::Snapshot(format!("malformed manifest file entry: {e}")))
}

fn entry_json(entry: &FileEntry) -> String {
    serde_json::to_string(entry).expect("entry serialises")
}

fn table<'py>(py: Python<'py>, batch: arrow_array::RecordBatch) -> PyResult<Bound<'py, PyAny>> {
    let schema = batch.schema();
    PyTable::try_new(vec![batch], schema)?.into_pyarrow(py)
}

/// Checks a file's bytes against its manifest entry (JSON): size and crc32c.
#[pyfunction]
fn format_check_file(
    py: Python<'_>,
    data: &[u8],
    entry: &str,
    checkpoint: u64,
    path: &str,
) -> PyResult<()> {
    py.detach(|| format::check_file(&entry_of(entry)?, data, checkpoint, path))
        .map_py()
}

/// The error of a file a manifest lists but the root does not hold.
#[pyfunction]
fn format_missing_file(checkpoint: u64, path: &str) -> PyErr {
    crate::errors::to_py(format::missing_file(checkpoint, path))
}

/// Why a file that matches its checksum still cannot be read as listed, or None.
#[pyfunction]
fn format_check_structure(py: Python<'_>, data: &[u8], entry: &str) -> PyResult<Option<String>> {
    py.detach(|| Ok(format::check_structure(&entry_of(entry)?, data)))
        .map_py()
}

/// Checks a manifest's bytes (JSON, format name and version, checkpoint id).
#[pyfunction]
fn format_check_manifest(
    py: Python<'_>,
    data: &[u8],
    what: &str,
    checkpoint_id: u64,
) -> PyResult<()> {
    py.detach(|| format::parse_manifest(data, what, checkpoint_id).map(drop))
        .map_py()
}

/// `chk-NNNNNNNN`: the directory name of checkpoint `checkpoint_id`.
#[pyfunction]
fn format_checkpoint_dir_name(checkpoint_id: u64) -> String {
    store::checkpoint_dir_name(checkpoint_id)
}

/// The checkpoint id of a directory name, or None if it is not one.
#[pyfunction]
fn format_parse_checkpoint_dir(name: &str) -> Option<u64> {
    store::parse_checkpoint_dir(name)
}

/// `name` as part of a file name: `[A-Za-z0-9_-]` stay, other bytes `%XX`.
#[pyfunction]
fn format_file_component(name: &str) -> String {
    store::file_component(name)
}

/// `<vertex>-<subtask>.channel-<edge>.<from_subtask>.arrow`
#[pyfunction]
fn format_channel_file_name(
    vertex: &str,
    subtask: usize,
    edge: &str,
    from_subtask: usize,
) -> String {
    store::channel_file_name(&task(vertex, subtask), edge, from_subtask)
}

/// The schema of `sources.arrow`, as an empty pyarrow table.
#[pyfunction]
fn format_sources_schema(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    table(py, format::sources_batch(&[]))
}

/// Full state from a chain of `(kind, table)`: one "full", then "diff"s.
#[pyfunction]
fn format_rebuild_state<'py>(
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

/// A task's state file: `(bytes, entry JSON)`. `kind` "full", or "diff"
/// against `base`; `sort` orders the rows by `key` (deterministic bytes).
/// With `chain_at` (`(checkpoint id, the base's chain)`, the chain a writer
/// keeps) the entry carries its chain, and a diff's base is the chain's last.
#[pyfunction]
#[pyo3(signature = (vertex, subtask, batch, key, kind = "full", base = None, sort = false, chain_at = None))]
#[allow(clippy::too_many_arguments)]
fn format_encode_state<'py>(
    py: Python<'py>,
    vertex: &str,
    subtask: usize,
    batch: AnyRecordBatch,
    key: &str,
    kind: &str,
    base: Option<u64>,
    sort: bool,
    chain_at: Option<(u64, Vec<u64>)>,
) -> PyResult<(Bound<'py, PyBytes>, String)> {
    let base = base.or_else(|| chain_at.as_ref().and_then(|(_, c)| c.last().copied()));
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
    let join = crate::state::one_batch(batch)?;
    let batch = join()?;
    let t = task(vertex, subtask);
    let (bytes, entry) = py
        .detach(|| {
            let batch = format::state_batch(&batch, key, diff)?;
            let batch = if sort {
                format::sort_by_key(&batch, key)?
            } else {
                batch
            };
            let mut entry = format::state_entry(
                &t,
                Some(key.into()),
                base.filter(|_| diff),
                format::Written {
                    rows: 0,
                    bytes: 0,
                    crc32c: 0,
                },
            );
            if let Some((id, base_chain)) = &chain_at {
                entry.chain = format::chain_after(*id, diff.then_some(base_chain.as_slice()));
            }
            let (bytes, w) = format::encode_ipc(&batch.schema(), &[batch], &entry.path)?;
            (entry.rows, entry.bytes, entry.crc32c) = (w.rows, w.bytes, w.crc32c);
            Ok::<_, Error>((bytes, entry))
        })
        .map_py()?;
    Ok((PyBytes::new(py, &bytes), entry_json(&entry)))
}

/// Any table as the bytes of an Arrow IPC file: `(bytes, rows, crc32c)`.
#[pyfunction]
fn format_encode_ipc<'py>(
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
/// `from_subtask` on input `input`: `(bytes, entry JSON)`.
#[pyfunction]
fn format_encode_channel<'py>(
    py: Python<'py>,
    vertex: &str,
    subtask: usize,
    edge: &str,
    from_subtask: usize,
    input: usize,
    records: AnyRecordBatch,
) -> PyResult<(Bound<'py, PyBytes>, String)> {
    let t = task(vertex, subtask);
    let name = store::channel_file_name(&t, edge, from_subtask);
    let (schema, batches) = batches_of(records, &name)?;
    let (bytes, w) = py
        .detach(|| format::encode_ipc(&schema, &batches, &name))
        .map_py()?;
    let entry = format::channel_entry(&t, edge, input, from_subtask, w);
    Ok((PyBytes::new(py, &bytes), entry_json(&entry)))
}

/// A file of a role the format leaves to its writer (e.g. `"output"`), named
/// `path`, with the writer's own entry `fields` (a JSON object):
/// `(bytes, entry JSON)`.
#[pyfunction]
#[pyo3(signature = (table, path, role, fields = "{}"))]
fn format_encode_file<'py>(
    py: Python<'py>,
    table: AnyRecordBatch,
    path: &str,
    role: &str,
    fields: &str,
) -> PyResult<(Bound<'py, PyBytes>, String)> {
    let fields = serde_json::from_str(fields)
        .map_err(|e| Error::Snapshot(format!("malformed manifest entry fields: {e}")))
        .map_py()?;
    let (schema, batches) = batches_of(table, path)?;
    let (bytes, w) = py
        .detach(|| format::encode_ipc(&schema, &batches, path))
        .map_py()?;
    let entry = format::other_entry(path, role, w, fields);
    Ok((PyBytes::new(py, &bytes), entry_json(&entry)))
}

/// The entry of a file of a role the format leaves to its writer, encoded
/// earlier (e.g. the Spark sink's output files, written by executors):
/// `rows`, `bytes` and `crc32c` of those bytes, the writer's own `fields`.
#[pyfunction]
#[pyo3(signature = (path, role, rows, size, crc32c, fields = "{}"))]
fn format_file_entry(
    path: &str,
    role: &str,
    rows: u64,
    size: u64,
    crc32c: u32,
    fields: &str,
) -> PyResult<String> {
    let fields = serde_json::from_str(fields)
        .map_err(|e| Error::Snapshot(format!("malformed manifest entry fields: {e}")))
        .map_py()?;
    let written = format::Written {
        rows,
        bytes: size,
        crc32c,
    };
    Ok(entry_json(&format::other_entry(
        path, role, written, fields,
    )))
}

/// The manifest of checkpoint `checkpoint_id` and its `sources.arrow`:
/// `(sources bytes, manifest bytes)`. `files`: JSON list of entries (the
/// sources entry is added); a state diff without a chain gets it from its
/// base's manifest, whose bytes `manifest_of(id)` gives.
#[pyfunction]
#[pyo3(signature = (checkpoint_id, files, manifest_of, tasks, offsets, protocol, graph_fingerprint, savepoint, started_ms, finished_ms, committed_ms, extra))]
#[allow(clippy::too_many_arguments)]
fn format_build_manifest<'py>(
    py: Python<'py>,
    checkpoint_id: u64,
    files: &str,
    manifest_of: &Bound<'py, PyAny>,
    tasks: Vec<(String, usize)>,
    offsets: Vec<(String, usize, u64)>,
    protocol: &str,
    graph_fingerprint: &str,
    savepoint: bool,
    started_ms: u64,
    finished_ms: u64,
    committed_ms: u64,
    extra: &str,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let id = checkpoint_id;
    let mut files: Vec<FileEntry> = serde_json::from_str(files)
        .map_err(|e| Error::Snapshot(format!("malformed manifest file entries: {e}")))
        .map_py()?;
    let extra: serde_json::Map<String, serde_json::Value> = serde_json::from_str(extra)
        .map_err(|e| Error::Snapshot(format!("malformed manifest fields: {e}")))
        .map_py()?;
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

/// A Python callable a driver of the format calls for bytes (the caller's
/// I/O). A `SnapshotError` it raises is the format's business (a missing or
/// broken file: the rule decides what it means); any other exception stops
/// the driver and is raised as it was.
struct Io<'a, 'py> {
    call: &'a Bound<'py, PyAny>,
    failed: std::cell::RefCell<Option<PyErr>>,
}

impl<'a, 'py> Io<'a, 'py> {
    fn new(call: &'a Bound<'py, PyAny>) -> Self {
        Self {
            call,
            failed: Default::default(),
        }
    }

    fn stopped() -> Error {
        Error::Snapshot("stopped by an I/O error".into())
    }

    fn outcome<T>(&self, r: PyResult<T>) -> Result<T, Error> {
        if self.failed.borrow().is_some() {
            return Err(Self::stopped());
        }
        r.map_err(|e| {
            let py = self.call.py();
            if e.is_instance_of::<crate::errors::SnapshotError>(py) {
                let msg = e.value(py).to_string();
                let prefix = Error::Snapshot(String::new()).to_string();
                Error::Snapshot(msg.strip_prefix(&prefix).unwrap_or(&msg).to_string())
            } else {
                *self.failed.borrow_mut() = Some(e);
                Self::stopped()
            }
        })
    }

    /// The manifest of checkpoint `id`, from the bytes the callable returns.
    fn manifest(&self, id: u64) -> Result<Manifest, Error> {
        let bytes = self.outcome(
            self.call
                .call1((id,))
                .and_then(|b| Ok(b.cast::<PyBytes>()?.as_bytes().to_vec())),
        )?;
        format::parse_manifest(&bytes, "manifest", id)
    }

    /// Calls the callable with `(checkpoint, entry JSON)`.
    fn check(&self, id: u64, entry: &FileEntry) -> Result<(), Error> {
        self.outcome(self.call.call1((id, entry_json(entry))).map(drop))
    }

    /// `r`, unless the callable raised something else: then that.
    fn finish<T>(self, r: Result<T, Error>) -> PyResult<T> {
        match self.failed.into_inner() {
            Some(e) => Err(e),
            None => r.map_py(),
        }
    }
}

/// `(complete ids, partial ids)` of a root's listing: `[(path relative to
/// the root, is a directory)]` (`format::scan_listing`).
#[pyfunction]
fn format_scan(listing: Vec<(String, bool)>) -> (Vec<u64>, Vec<u64>) {
    let scan = format::scan_listing(listing.iter().map(|(p, d)| (p.as_str(), *d)));
    let (complete, partial): (Vec<_>, Vec<_>) = scan.into_iter().partition(|(_, c)| *c);
    (
        complete.into_iter().map(|(id, _)| id).collect(),
        partial.into_iter().map(|(id, _)| id).collect(),
    )
}

/// The error of a manifest that is not there: partial when its directory
/// exists, else a checkpoint that does not exist.
#[pyfunction]
fn format_missing_manifest(checkpoint_id: u64, dir: &str, root: &str, dir_exists: bool) -> PyErr {
    crate::errors::to_py(format::missing_manifest(
        checkpoint_id,
        dir,
        root,
        dir_exists,
    ))
}

/// THE retention rule over a root (`format::retention_of_root`): the
/// complete checkpoints to delete, from the root's listing (as
/// [`format_scan`]) and `manifest_of(id)`, their manifests' bytes.
#[pyfunction]
fn format_retention(
    listing: Vec<(String, bool)>,
    manifest_of: &Bound<'_, PyAny>,
    retain: usize,
) -> PyResult<Vec<u64>> {
    if retain < 1 {
        return Err(crate::errors::SnapshotError::new_err(
            "retain must be at least 1 completed checkpoint",
        ));
    }
    let scan = format::scan_listing(listing.iter().map(|(p, d)| (p.as_str(), *d)));
    let io = Io::new(manifest_of);
    let removed = format::retention_of_root(&scan, |id| io.manifest(id), retain);
    io.finish(Ok(removed))
}

/// `([(checkpoint, file entry JSON)], [problems])` of a verify plan.
type VerifyPlanTuple = (Vec<(u64, String)>, Vec<String>);

/// What verifying checkpoint `checkpoint_id` reads (`format::plan_verify`):
/// every file of it and the state files of the bases its chains need, and
/// its structural problems (a base whose manifest `manifest_of(id)` cannot
/// give is one).
#[pyfunction]
fn format_verify_plan(
    checkpoint_id: u64,
    manifest: &[u8],
    manifest_of: &Bound<'_, PyAny>,
) -> PyResult<VerifyPlanTuple> {
    let m = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    let io = Io::new(manifest_of);
    let (plan, bases) = format::plan_verify_with(checkpoint_id, &m, |id| io.manifest(id));
    let files = plan
        .files
        .iter()
        .map(|&(cid, i)| {
            let owner = match bases.get(&cid) {
                Some(Ok(b)) => b,
                _ => &m,
            };
            (cid, entry_json(&owner.files[i]))
        })
        .collect();
    io.finish(Ok((files, plan.problems)))
}

/// Verifies checkpoint `checkpoint_id` as a restore relies on it
/// (`format::verify_with`): `manifest_of(id)` gives a base's manifest
/// bytes, `check(id, entry JSON)` reads and checks one file.
#[pyfunction]
fn format_verify(
    checkpoint_id: u64,
    manifest: &[u8],
    manifest_of: &Bound<'_, PyAny>,
    check: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let m = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    let (bases, files) = (Io::new(manifest_of), Io::new(check));
    let r = format::verify_with(
        checkpoint_id,
        &m,
        |id| bases.manifest(id),
        |id, f| files.check(id, f),
    );
    let r = files.finish(Ok(r))?;
    bases.finish(r)
}

/// A complete checkpoint's summary (`format::summarize`) as JSON.
#[pyfunction]
fn format_summary(manifest: &[u8], checkpoint_id: u64) -> PyResult<String> {
    let m = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    Ok(serde_json::to_string(&format::summarize(&m)).expect("summary serialises"))
}

/// Every checkpoint a manifest's files need (itself included), ascending.
#[pyfunction]
fn format_needs(py: Python<'_>, manifest: &[u8], checkpoint_id: u64) -> PyResult<Vec<u64>> {
    py.detach(|| format::parse_manifest(manifest, "manifest", checkpoint_id).map(|m| m.needs()))
        .map_py()
}

/// The state files that rebuild `(vertex, subtask)`'s state at checkpoint
/// `checkpoint_id` (`manifest`: its manifest bytes), oldest first, as
/// `[(checkpoint, "full" | "diff", entry JSON)]`; None when the manifest holds
/// no state for the task. `manifest_of(id)` returns a base checkpoint's
/// manifest bytes: Python moves the bytes (its errors pass through), the
/// chain rules are `format::state_chain`, `chain_link` and `link_kind`.
/// `(checkpoint, "full" | "diff", entry JSON)`.
type ChainLink = (u64, &'static str, String);

#[pyfunction]
fn format_state_chain(
    checkpoint_id: u64,
    manifest: &[u8],
    vertex: &str,
    subtask: usize,
    manifest_of: &Bound<'_, PyAny>,
) -> PyResult<Option<Vec<ChainLink>>> {
    let t = task(vertex, subtask);
    let top = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    let Some(entry) = top.state_file(&t) else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for cid in format::state_chain(checkpoint_id, entry) {
        let base;
        let m = if cid == checkpoint_id {
            &top
        } else {
            let bytes = manifest_of.call1((cid,))?;
            let bytes = bytes.cast::<PyBytes>()?.as_bytes();
            base = format::parse_manifest(bytes, "manifest", cid).map_py()?;
            &base
        };
        let f = format::chain_link(checkpoint_id, &t, cid, m).map_py()?;
        let kind = match format::link_kind(cid, f).map_py()? {
            StateKind::Full => "full",
            StateKind::Diff { .. } => "diff",
        };
        out.push((cid, kind, entry_json(f)));
    }
    Ok(Some(out))
}

/// `[(vertex, subtask, entry JSON)]` of a checkpoint's state files.
#[pyfunction]
fn format_state_files(
    manifest: &[u8],
    checkpoint_id: u64,
) -> PyResult<Vec<(String, usize, String)>> {
    let m = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    Ok(format::state_files(&m)
        .map(|(t, f)| (t.vertex, t.subtask, entry_json(f)))
        .collect())
}

/// `[(input, edge, from_subtask, entry JSON)]` of the channel files
/// `(vertex, subtask)` recorded at a checkpoint.
#[pyfunction]
fn format_channel_files(
    manifest: &[u8],
    checkpoint_id: u64,
    vertex: &str,
    subtask: usize,
) -> PyResult<Vec<(usize, String, usize, String)>> {
    let m = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    let t = task(vertex, subtask);
    Ok(format::channel_files(&m, &t)
        .map(|f| {
            (
                f.input.unwrap_or_default(),
                f.edge.clone().unwrap_or_default(),
                f.from_subtask.unwrap_or_default(),
                entry_json(f),
            )
        })
        .collect())
}

/// `(table, role, index, (vertex, subtask) or None, entry JSON)` of a part.
type ExportPartTuple = (String, String, u64, Option<(String, usize)>, String);

/// Every part an export of a checkpoint writes (`format::export_plan`).
#[pyfunction]
fn format_export_plan(manifest: &[u8], checkpoint_id: u64) -> PyResult<Vec<ExportPartTuple>> {
    let m = format::parse_manifest(manifest, "manifest", checkpoint_id).map_py()?;
    let plan = format::export_plan(&m).map_py()?;
    Ok(plan
        .into_iter()
        .map(|p| {
            let entry = entry_json(&m.files[p.file]);
            (
                p.table,
                p.role,
                p.index,
                p.task.map(|t| (t.vertex, t.subtask)),
                entry,
            )
        })
        .collect())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(crc32c_of, m)?)?;
    m.add_function(wrap_pyfunction!(format_check_file, m)?)?;
    m.add_function(wrap_pyfunction!(format_missing_file, m)?)?;
    m.add_function(wrap_pyfunction!(format_check_structure, m)?)?;
    m.add_function(wrap_pyfunction!(format_check_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(format_rebuild_state, m)?)?;
    m.add_function(wrap_pyfunction!(format_encode_state, m)?)?;
    m.add_function(wrap_pyfunction!(format_encode_ipc, m)?)?;
    m.add_function(wrap_pyfunction!(format_build_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(format_retention, m)?)?;
    m.add_function(wrap_pyfunction!(format_verify_plan, m)?)?;
    m.add_function(wrap_pyfunction!(format_verify, m)?)?;
    m.add_function(wrap_pyfunction!(format_scan, m)?)?;
    m.add_function(wrap_pyfunction!(format_missing_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(format_summary, m)?)?;
    m.add_function(wrap_pyfunction!(format_encode_channel, m)?)?;
    m.add_function(wrap_pyfunction!(format_encode_file, m)?)?;
    m.add_function(wrap_pyfunction!(format_file_entry, m)?)?;
    m.add_function(wrap_pyfunction!(format_state_files, m)?)?;
    m.add_function(wrap_pyfunction!(format_channel_files, m)?)?;
    m.add_function(wrap_pyfunction!(format_export_plan, m)?)?;
    m.add_function(wrap_pyfunction!(format_needs, m)?)?;
    m.add_function(wrap_pyfunction!(format_state_chain, m)?)?;
    m.add_function(wrap_pyfunction!(format_checkpoint_dir_name, m)?)?;
    m.add_function(wrap_pyfunction!(format_parse_checkpoint_dir, m)?)?;
    m.add_function(wrap_pyfunction!(format_file_component, m)?)?;
    m.add_function(wrap_pyfunction!(format_channel_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(format_sources_schema, m)?)?;
    m.add_class::<SnapshotReader>()?;
    m.add_class::<SnapshotStore>()?;
    m.add("SNAPSHOT_FORMAT", format_constants(m.py())?)?;
    Ok(())
}
