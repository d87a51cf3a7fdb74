//! Private test hooks (`_core._replay_source`, `_core._keyed_roundtrip`,
//! `_core._keyed_checkpoints`, `_core._keyed_restore`): drive one
//! Python-backed source or keyed operator directly, to test replay from an
//! offset, incremental checkpoints and state restore without a whole job
//! (whose checkpoint timing is not deterministic).

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3_arrow::PyRecordBatch;
use snapcut_core::operator::{Batch, Emitter, Operator, OperatorFactory, Source, SourceFactory};
use snapcut_core::runtime::StateMemory;
use snapcut_core::snapshot::{StateCapture, StateKind};

use super::convert::to_pyarrow;
use super::keyed::KeyedProcessFactory;
use super::source::{BatchesSourceFactory, PyIterSourceFactory};
use crate::errors::IntoPyResult;
use crate::state::spill_stats_dict;

/// `(snapshot state, outputs after restore, state at the end)`.
type Roundtrip<'py> = (Bound<'py, PyAny>, Vec<Bound<'py, PyAny>>, Bound<'py, PyAny>);

struct VecEmitter(Vec<Batch>);

impl Emitter for VecEmitter {
    fn emit(&mut self, batch: Batch) -> snapcut_core::Result<()> {
        self.0.push(batch);
        Ok(())
    }
}

fn drain<'py>(
    py: Python<'py>,
    mut source: Box<dyn Source>,
    offset: u64,
) -> PyResult<(Vec<Bound<'py, PyAny>>, u64)> {
    if offset > 0 {
        source.seek(offset).map_py()?;
    }
    let mut out = Vec::new();
    while let Some(b) = source.next_batch().map_py()? {
        out.push(to_pyarrow(py, b)?);
    }
    Ok((out, source.offset()))
}

/// Subtask `subtask` of a source (`make_iter` for a Python source, else
/// `batches`), sought to `offset` and read to its end: `(batches, offset)`.
#[pyfunction]
#[pyo3(signature = (subtask, parallelism, offset, make_iter=None, batches=None))]
pub fn _replay_source<'py>(
    py: Python<'py>,
    subtask: usize,
    parallelism: usize,
    offset: u64,
    make_iter: Option<Py<PyAny>>,
    batches: Option<Vec<PyRecordBatch>>,
) -> PyResult<(Vec<Bound<'py, PyAny>>, u64)> {
    let source = match (make_iter, batches) {
        (Some(f), None) => PyIterSourceFactory {
            name: "replay".into(),
            make_iter: Arc::new(f),
        }
        .create(subtask, parallelism),
        (None, Some(b)) => BatchesSourceFactory {
            batches: Arc::new(b.into_iter().map(PyRecordBatch::into_inner).collect()),
        }
        .create(subtask, parallelism),
        _ => {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "pass exactly one of make_iter or batches",
            ))
        }
    }
    .map_py()?;
    drain(py, source, offset)
}

/// A keyed process operator fed `before`, snapshotted, then a fresh one
/// restored from that snapshot and fed `after`:
/// `(snapshot state, outputs after restore, state at the end)`.
#[pyfunction]
pub fn _keyed_roundtrip<'py>(
    py: Python<'py>,
    key: String,
    func: Py<PyAny>,
    before: Vec<PyRecordBatch>,
    after: Vec<PyRecordBatch>,
) -> PyResult<Roundtrip<'py>> {
    let factory = KeyedProcessFactory {
        name: "roundtrip".into(),
        key,
        func: Arc::new(func),
    };
    let mut first: Box<dyn Operator> = factory.create(0, 1).map_py()?;
    let mut sink = VecEmitter(Vec::new());
    for b in before {
        first.process(0, b.into_inner(), &mut sink).map_py()?;
    }
    let capture = first
        .snapshot(1)
        .map_py()?
        .expect("keyed state is captured");
    let mut second = factory.create(0, 1).map_py()?;
    second.restore(std::slice::from_ref(&capture)).map_py()?;
    let mut out = VecEmitter(Vec::new());
    for b in after {
        second.process(0, b.into_inner(), &mut out).map_py()?;
    }
    let end = second
        .snapshot(2)
        .map_py()?
        .expect("keyed state is captured");
    if end.kind != StateKind::Full {
        return Err(pyo3::exceptions::PyAssertionError::new_err(
            "keyed state must be Full",
        ));
    }
    let outputs = out
        .0
        .into_iter()
        .map(|b| to_pyarrow(py, b))
        .collect::<PyResult<Vec<_>>>()?;
    Ok((
        to_pyarrow(py, capture.batch)?,
        outputs,
        to_pyarrow(py, end.batch)?,
    ))
}

/// One checkpoint's capture as Python sees it: `(kind, base, batch)`.
type Checkpointed<'py> = (&'static str, Option<u64>, Bound<'py, PyAny>);

fn keyed_operator(
    key: String,
    func: Py<PyAny>,
    full_every: u32,
    memory: Option<StateMemory>,
) -> PyResult<Box<dyn Operator>> {
    let mut op = KeyedProcessFactory {
        name: "keyed".into(),
        key,
        func: Arc::new(func),
    }
    .create(0, 1)
    .map_py()?;
    op.set_full_every(full_every);
    if let Some(memory) = &memory {
        op.set_state_memory(memory).map_py()?;
    }
    Ok(op)
}

/// `state_memory` bytes spilling under `spill_dir`, as a job's
/// `Checkpointing(state_memory=, spill_dir=)` gives each subtask.
fn memory_of(
    state_memory: Option<usize>,
    spill_dir: Option<PathBuf>,
) -> PyResult<Option<StateMemory>> {
    match (state_memory, spill_dir) {
        (None, None) => Ok(None),
        (Some(budget), Some(spill_dir)) => Ok(Some(StateMemory { budget, spill_dir })),
        _ => Err(pyo3::exceptions::PyTypeError::new_err(
            "pass both state_memory and spill_dir, or neither",
        )),
    }
}

/// The operator's `spill_stats()` appended to `spill` (a list), if asked.
fn report_spill(
    py: Python<'_>,
    op: &dyn Operator,
    spill: Option<&Bound<'_, PyList>>,
) -> PyResult<()> {
    if let Some(list) = spill {
        match op.spill_stats() {
            Some(s) => list.append(spill_stats_dict(py, &s)?)?,
            None => list.append(py.None())?,
        }
    }
    Ok(())
}

/// A keyed process (`full_every` as a job would set it) fed `steps[i]`
/// then checkpointed as checkpoint `i + 1`, which completes (commit) unless
/// it is in `aborted` (abort): every capture as `(kind, base, batch)`. With `timings` (a
/// list), appends each checkpoint's sync-phase time in nanoseconds (benches).
/// With `state_memory` (bytes) and `spill_dir`, the operator spills past
/// that budget, and `spill` (a list) gets its `spill_stats()` at the end.
#[pyfunction]
#[pyo3(signature = (
    key, func, steps, full_every, aborted=Vec::new(), timings=None, state_memory=None,
    spill_dir=None, spill=None
))]
#[allow(clippy::too_many_arguments)]
pub fn _keyed_checkpoints<'py>(
    py: Python<'py>,
    key: String,
    func: Py<PyAny>,
    steps: Vec<Vec<PyRecordBatch>>,
    full_every: u32,
    aborted: Vec<u64>,
    timings: Option<Bound<'py, PyList>>,
    state_memory: Option<usize>,
    spill_dir: Option<PathBuf>,
    spill: Option<Bound<'py, PyList>>,
) -> PyResult<Vec<Checkpointed<'py>>> {
    let memory = memory_of(state_memory, spill_dir)?;
    let mut op = keyed_operator(key, func, full_every, memory)?;
    let mut sink = VecEmitter(Vec::new());
    let mut out = Vec::new();
    for (i, step) in steps.into_iter().enumerate() {
        let id = i as u64 + 1;
        for b in step {
            op.process(0, b.into_inner(), &mut sink).map_py()?;
        }
        let started = std::time::Instant::now();
        let capture = op.snapshot(id).map_py()?.expect("keyed state is captured");
        if let Some(t) = &timings {
            t.append(started.elapsed().as_nanos() as u64)?;
        }
        let (kind, base) = match capture.kind {
            StateKind::Full => ("full", None),
            StateKind::Diff { base } => ("diff", Some(base)),
        };
        out.push((kind, base, to_pyarrow(py, capture.batch)?));
        // Each checkpoint completes (the runtime calls commit) unless aborted.
        if aborted.contains(&id) {
            op.abort(id).map_py()?;
        } else {
            op.commit(id).map_py()?;
        }
    }
    report_spill(py, op.as_ref(), spill.as_ref())?;
    Ok(out)
}

/// A keyed process restored from `chain` (`(kind, base, batch)`, as
/// `_keyed_checkpoints` returns) and fed `after`: `(outputs, full state)`.
/// `state_memory`, `spill_dir` and `spill` as for `_keyed_checkpoints`.
#[pyfunction]
#[pyo3(signature = (key, func, chain, after, state_memory=None, spill_dir=None, spill=None))]
#[allow(clippy::too_many_arguments)]
pub fn _keyed_restore<'py>(
    py: Python<'py>,
    key: String,
    func: Py<PyAny>,
    chain: Vec<(String, Option<u64>, PyRecordBatch)>,
    after: Vec<PyRecordBatch>,
    state_memory: Option<usize>,
    spill_dir: Option<PathBuf>,
    spill: Option<Bound<'py, PyList>>,
) -> PyResult<(Vec<Bound<'py, PyAny>>, Bound<'py, PyAny>)> {
    let chain = chain
        .into_iter()
        .map(|(kind, base, batch)| {
            let kind = match (kind.as_str(), base) {
                ("full", None) => StateKind::Full,
                ("diff", Some(base)) => StateKind::Diff { base },
                _ => {
                    return Err(pyo3::exceptions::PyValueError::new_err(
                        "a chain entry is ('full', None, batch) or ('diff', base, batch)",
                    ))
                }
            };
            Ok(StateCapture {
                kind,
                batch: batch.into_inner(),
                filter: None,
                times: None,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let memory = memory_of(state_memory, spill_dir)?;
    let mut op = keyed_operator(key, func, 1, memory)?;
    op.restore(&chain).map_py()?;
    let mut out = VecEmitter(Vec::new());
    for b in after {
        op.process(0, b.into_inner(), &mut out).map_py()?;
    }
    report_spill(py, op.as_ref(), spill.as_ref())?;
    let end = op
        .snapshot(u64::MAX)
        .map_py()?
        .expect("keyed state is captured");
    let outputs = out
        .0
        .into_iter()
        .map(|b| to_pyarrow(py, b))
        .collect::<PyResult<Vec<_>>>()?;
    Ok((outputs, to_pyarrow(py, end.batch)?))
}
