//! The local-path snapshot store and reader, for `snapcut.snapshots`, and
//! the format's constants and checksum. Manifests cross as JSON text (Python
//! parses them with the same schema the pure-Python reader uses); Arrow data
//! crosses through the PyCapsule interface. The format's rules for other
//! roots are the `format` submodule ([`crate::format`]).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3_arrow::{PyRecordBatch, PyTable};
use snapcut_core::protocol::ProtocolKind;
use snapcut_core::snapshot::{
    ChannelLog, CheckpointMeta, SnapshotSink, StateCapture, StateKind, TaskId, TaskSnapshot,
};
use snapcut_core::state::{DELETED_COLUMN, KEY_METADATA, LIVE_KEYS_METADATA, TIME_METADATA};
use snapcut_core::store::{
    self, CompactionBudget, CompactionStats, SnapshotReader as CoreReader,
    SnapshotStore as CoreStore, StoreOptions,
};

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

    /// Ids of partial checkpoint directories (no manifest nor held record).
    fn partial(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        py.detach(|| self.inner.partial()).map_py()
    }

    /// `{id: [file names]}` of the held directories (checkpoints retention
    /// removed whose runs newer checkpoints read).
    fn held(&self, py: Python<'_>) -> PyResult<std::collections::BTreeMap<u64, Vec<String>>> {
        py.detach(|| self.inner.held())
            .map(|h| {
                h.into_iter()
                    .map(|(id, files)| (id, files.into_iter().collect()))
                    .collect()
            })
            .map_py()
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
    #[pyo3(signature = (root, retain = 3, cleanup_partial_on_open = true, materialize_every = None, fsync = "syncfs", compaction_cpu_share = 1.0, compaction_bytes_per_s = None, direct_io = true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        root: std::path::PathBuf,
        retain: usize,
        cleanup_partial_on_open: bool,
        materialize_every: Option<usize>,
        fsync: &str,
        compaction_cpu_share: f64,
        compaction_bytes_per_s: Option<u64>,
        direct_io: bool,
    ) -> PyResult<Self> {
        let options = StoreOptions {
            retain,
            cleanup_partial_on_open,
            materialize_every,
            fsync: fsync.parse().map_py()?,
            direct_io,
            compaction: CompactionBudget {
                cpu_share: compaction_cpu_share,
                bytes_per_s: compaction_bytes_per_s,
            },
            ..Default::default()
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
                    filter: None,
                    times: None,
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
            state_runs: None,
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

    /// Waits, at most `timeout` seconds, until every background compaction
    /// handed over is done (its output waiting for the next commit to adopt
    /// it); True if so. For tests and tools: a commit never waits for them.
    fn wait_for_compactions(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let timeout = std::time::Duration::try_from_secs_f64(timeout)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("timeout: {e}")))?;
        Ok(py.detach(|| self.inner.wait_for_compactions(timeout)))
    }

    /// What the background compaction has done since the store opened
    /// (`compaction_dict`).
    fn compaction_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        compaction_dict(py, &self.inner.compaction_stats())
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
    d.set_item("HELD_FILE", store::HELD_FILE)?;
    d.set_item("HELD_TMP_FILE", store::HELD_TMP_FILE)?;
    d.set_item("SOURCES_FILE", store::SOURCES_FILE)?;
    d.set_item("CHECKPOINT_DIR_PREFIX", store::CHECKPOINT_DIR_PREFIX)?;
    d.set_item("DELETED_COLUMN", DELETED_COLUMN)?;
    d.set_item("KEY_METADATA", KEY_METADATA)?;
    d.set_item("LIVE_KEYS_METADATA", LIVE_KEYS_METADATA)?;
    d.set_item("TIME_METADATA", TIME_METADATA)?;
    Ok(d)
}

/// CRC-32C (Castagnoli) of `data`: the checksum of every snapshot file.
#[pyfunction(name = "crc32c")]
fn crc32c_of(py: Python<'_>, data: &[u8]) -> u32 {
    py.detach(|| ::crc32c::crc32c(data))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(crc32c_of, m)?)?;
    m.add_class::<SnapshotReader>()?;
    m.add_class::<SnapshotStore>()?;
    m.add("SNAPSHOT_FORMAT", format_constants(m.py())?)?;
    Ok(())
}

/// A compactor's counts as Python sees them (`snapcut.CompactionStats`):
/// jobs submitted, merged, adopted, discarded, failed and pending; tasks
/// refused; bytes read and written; seconds busy and resting (its budget).
pub(crate) fn compaction_dict<'py>(
    py: Python<'py>,
    s: &CompactionStats,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, n) in [
        ("submitted", s.submitted),
        ("merged", s.merged),
        ("adopted", s.adopted),
        ("discarded", s.discarded),
        ("failed", s.failed),
        ("refused", s.refused),
        ("pending", s.pending),
        ("bytes_read", s.bytes_read),
        ("bytes_written", s.bytes_written),
    ] {
        d.set_item(name, n)?;
    }
    d.set_item("busy_s", s.busy.as_secs_f64())?;
    d.set_item("rested_s", s.rested.as_secs_f64())?;
    Ok(d)
}
