//! A finished job as plain Python objects: dicts, lists and pyarrow tables.
//! `snapcut.dataflow.RunReport.from_raw` turns them into dataclasses.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::Schema;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use snapcut_core::runtime::ops::Collected;
use snapcut_core::runtime::{
    CheckpointMetrics, CheckpointStatus, JobReport, Restart, RestartScope,
};
use snapcut_core::snapshot::{CompletedCheckpoint, TaskSnapshot};

use super::convert::table_to_pyarrow;
use crate::store::compaction_dict;

/// A completed checkpoint kept on the Rust side, so that a job can be
/// restored from it (`Dataflow.run(restore_from=snapshot)`).
#[pyclass(frozen, module = "snapcut._core", name = "_Checkpoint")]
pub struct PyCheckpoint {
    pub inner: CompletedCheckpoint,
}

#[pymethods]
impl PyCheckpoint {
    #[getter]
    fn id(&self) -> u64 {
        self.inner.meta.id
    }

    fn __repr__(&self) -> String {
        format!(
            "_Checkpoint(id={}, tasks={})",
            self.inner.meta.id,
            self.inner.tasks.len()
        )
    }
}

fn table<'py>(py: Python<'py>, batches: Vec<RecordBatch>) -> PyResult<Bound<'py, PyAny>> {
    let schema = batches
        .first()
        .map(|b| b.schema())
        .unwrap_or_else(|| Arc::new(Schema::empty()));
    table_to_pyarrow(py, batches, schema)
}

fn metrics<'py>(py: Python<'py>, m: &CheckpointMetrics) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", m.id)?;
    d.set_item("protocol", m.protocol.name())?;
    let (status, reason) = match &m.status {
        CheckpointStatus::Completed => ("completed", None),
        CheckpointStatus::Aborted(r) => ("aborted", Some(r.clone())),
    };
    d.set_item("status", status)?;
    d.set_item("abort_reason", reason)?;
    d.set_item("is_final", m.is_final)?;
    d.set_item("savepoint", m.savepoint)?;
    d.set_item("triggered_s", m.triggered_at.as_secs_f64())?;
    d.set_item("finished_s", m.finished_at.as_secs_f64())?;
    d.set_item("duration_s", m.duration.as_secs_f64())?;
    let align = PyDict::new(py);
    for (task, dur) in &m.alignment {
        align.set_item(task.to_string(), dur.as_nanos() as u64)?;
    }
    d.set_item("alignment_ns", align)?;
    d.set_item("state_bytes", m.state_bytes)?;
    d.set_item("logged_records", m.logged_records)?;
    d.set_item("logged_batches", m.logged_batches)?;
    let store = match &m.store {
        Some(st) => {
            let sd = PyDict::new(py);
            sd.set_item("bytes_written", st.bytes_written)?;
            sd.set_item("runs_max", st.runs_max)?;
            sd.set_item("runs_total", st.runs_total)?;
            sd.set_item("debt_bytes", st.debt_bytes)?;
            sd.set_item("compaction", compaction_dict(py, &st.compaction)?)?;
            Some(sd)
        }
        None => None,
    };
    d.set_item("store", store)?;
    Ok(d)
}

fn task_snapshot<'py>(py: Python<'py>, t: &TaskSnapshot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("task", t.task.to_string())?;
    let state = match &t.state {
        Some(s) => Some(table(py, vec![s.batch.clone()])?),
        None => None,
    };
    d.set_item("state", state)?;
    let channels = PyList::empty(py);
    for c in &t.channels {
        let ch = PyDict::new(py);
        ch.set_item("edge", &c.edge)?;
        ch.set_item("input", c.input)?;
        ch.set_item("from_subtask", c.from_subtask)?;
        ch.set_item("records", table(py, c.records.clone())?)?;
        channels.append(ch)?;
    }
    d.set_item("channels", channels)?;
    d.set_item("source_offset", t.source_offset)?;
    d.set_item("alignment_ns", t.alignment_nanos)?;
    Ok(d)
}

fn snapshot<'py>(py: Python<'py>, c: &CompletedCheckpoint) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("id", c.meta.id)?;
    d.set_item("protocol", c.meta.protocol.name())?;
    d.set_item("started_ms", c.meta.started_ms)?;
    d.set_item("finished_ms", c.meta.finished_ms)?;
    let tasks = PyList::empty(py);
    for t in c.tasks.values() {
        tasks.append(task_snapshot(py, t)?)?;
    }
    d.set_item("tasks", tasks)?;
    d.set_item("handle", PyCheckpoint { inner: c.clone() })?;
    Ok(d)
}

/// Restarts as `(error, restored_from, region, [task, ...], scope, failed,
/// fallback, at_s, downtime_s)`: `region` is `None` for a rebuild of the
/// whole job or an `upstream` restart; `scope` is "job", "region" or "upstream".
pub fn restarts_to_py(restarts: &[Restart]) -> Vec<RawRestart> {
    restarts
        .iter()
        .map(|r| {
            let (scope, region, tasks) = match &r.scope {
                RestartScope::Job => ("job", None, Vec::new()),
                RestartScope::Region { region, tasks } => ("region", Some(*region), tasks.clone()),
                RestartScope::Upstream { tasks } => ("upstream", None, tasks.clone()),
            };
            (
                r.error.clone(),
                r.restored_from,
                region,
                tasks.iter().map(|t| t.to_string()).collect(),
                scope,
                r.failed.as_ref().map(|t| t.to_string()),
                r.fallback.clone(),
                r.at.map(|d| d.as_secs_f64()),
                r.downtime.map(|d| d.as_secs_f64()),
            )
        })
        .collect()
}

type RawRestart = (
    String,
    Option<u64>,
    Option<usize>,
    Vec<String>,
    &'static str,
    Option<String>,
    Option<String>,
    Option<f64>,
    Option<f64>,
);

/// The raw report: `results`, `checkpoints`, `snapshots`, counts and timings.
pub fn to_py<'py>(
    py: Python<'py>,
    report: &JobReport,
    results: &[(String, Collected)],
    snapshots: &[CompletedCheckpoint],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let res = PyDict::new(py);
    for (name, collected) in results {
        let batches = collected.batches();
        if let Some(first) = batches.first() {
            if let Some(other) = batches.iter().find(|b| b.schema() != first.schema()) {
                return Err(crate::errors::to_py(snapcut_core::Error::Task(format!(
                    "result {name:?} received batches of different schemas ({} and {}); \
                     make every operator upstream of it return one schema",
                    first.schema(),
                    other.schema()
                ))));
            }
        }
        res.set_item(name, table(py, batches)?)?;
    }
    d.set_item("results", res)?;
    let cps = PyList::empty(py);
    for m in &report.checkpoints {
        cps.append(metrics(py, m)?)?;
    }
    d.set_item("checkpoints", cps)?;
    let snaps = PyList::empty(py);
    for c in snapshots {
        snaps.append(snapshot(py, c)?)?;
    }
    d.set_item("snapshots", snaps)?;
    d.set_item("protocol", report.protocol.name())?;
    d.set_item("records_in", report.records_in)?;
    d.set_item("records_out", report.records_out)?;
    let dropped = PyDict::new(py);
    for t in &report.tasks {
        dropped.set_item(t.task.to_string(), t.replayed_dropped)?;
    }
    d.set_item("replayed_dropped", dropped)?;
    let spill = PyDict::new(py);
    for t in &report.tasks {
        if let Some(s) = &t.spill {
            spill.set_item(t.task.to_string(), crate::state::spill_stats_dict(py, s)?)?;
        }
    }
    d.set_item("spill", spill)?;
    let task_timeline = PyDict::new(py);
    for t in &report.tasks {
        task_timeline.set_item(t.task.to_string(), t.timeline.clone())?;
    }
    d.set_item("task_timeline", task_timeline)?;
    d.set_item("duration_s", report.elapsed.as_secs_f64())?;
    d.set_item("timeline_bucket_s", report.timeline_bucket.as_secs_f64())?;
    let timeline = PyDict::new(py);
    for (vertex, counts) in &report.timeline {
        timeline.set_item(vertex, counts.clone())?;
    }
    d.set_item("timeline", timeline)?;
    Ok(d)
}
