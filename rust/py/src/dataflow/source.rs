//! Sources backed by Python: a re-startable iterator of record batches
//! (iterables, generators made by a function, `pyarrow.dataset` scans) and a
//! list of batches held in Rust. Both are replayable: the offset is the number
//! of records this subtask has emitted, and `seek` replays up to it.
//!
//! With parallelism p, subtask i takes items i, i+p, i+2p, ... of the stream.

use std::sync::Arc;

use arrow_array::RecordBatch;
use pyo3::intern;
use pyo3::prelude::*;
use snapcut_core::operator::{Batch, Source, SourceFactory};
use snapcut_core::{Error, Result};

use super::convert::{batches_from_py, task_error};

/// Skips the first `offset` records of a batch stream (replay on restore).
fn skip_records(
    mut next: impl FnMut() -> Result<Option<Batch>>,
    offset: u64,
) -> Result<Option<Batch>> {
    let mut skipped = 0u64;
    while skipped < offset {
        let Some(batch) = next()? else {
            return Err(Error::Task(format!(
                "cannot seek to offset {offset}: the source has only {skipped} records"
            )));
        };
        let rows = batch.num_rows() as u64;
        if skipped + rows > offset {
            let keep_from = (offset - skipped) as usize;
            return Ok(Some(batch.slice(keep_from, batch.num_rows() - keep_from)));
        }
        skipped += rows;
    }
    Ok(None)
}

/// `make_iter()` returns a fresh iterator of `pyarrow.RecordBatch`es each time.
pub struct PyIterSourceFactory {
    pub name: String,
    pub make_iter: Arc<Py<PyAny>>,
}

impl SourceFactory for PyIterSourceFactory {
    fn create(&self, subtask: usize, parallelism: usize) -> Result<Box<dyn Source>> {
        Ok(Box::new(PyIterSource {
            name: self.name.clone(),
            make_iter: Arc::clone(&self.make_iter),
            iter: None,
            item: 0,
            subtask,
            parallelism,
            offset: 0,
            pending: None,
        }))
    }
}

struct PyIterSource {
    name: String,
    make_iter: Arc<Py<PyAny>>,
    iter: Option<Py<PyAny>>,
    /// Index of the next item of the whole stream (all subtasks').
    item: u64,
    subtask: usize,
    parallelism: usize,
    offset: u64,
    /// Left over from a seek into the middle of a batch.
    pending: Option<Batch>,
}

impl PyIterSource {
    fn pull(&mut self) -> Result<Option<Batch>> {
        Python::attach(|py| self.pull_py(py).map_err(|e| task_error(py, &self.name, e)))
    }

    fn pull_py(&mut self, py: Python<'_>) -> PyResult<Option<Batch>> {
        if self.iter.is_none() {
            let iterable = self.make_iter.bind(py).call0()?;
            self.iter = Some(iterable.try_iter()?.into_any().unbind());
        }
        let iter = self.iter.as_ref().expect("iterator set").bind(py).clone();
        let builtins = py.import(intern!(py, "builtins"))?;
        let next = builtins.getattr(intern!(py, "next"))?;
        loop {
            let item = next.call1((&iter, py.None()))?;
            if item.is_none() {
                return Ok(None);
            }
            let mine = self.item % self.parallelism as u64 == self.subtask as u64;
            self.item += 1;
            if mine {
                let batches = batches_from_py(&item)?;
                let batch = match batches.len() {
                    1 => batches.into_iter().next().expect("one batch"),
                    _ => concat(batches)?,
                };
                return Ok(Some(batch));
            }
        }
    }
}

fn concat(batches: Vec<RecordBatch>) -> PyResult<RecordBatch> {
    let Some(first) = batches.first() else {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "a source item must hold at least one batch",
        ));
    };
    arrow_select::concat::concat_batches(&first.schema(), &batches)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

impl Source for PyIterSource {
    fn next_batch(&mut self) -> Result<Option<Batch>> {
        let batch = match self.pending.take() {
            Some(b) => Some(b),
            None => self.pull()?,
        };
        if let Some(b) = &batch {
            self.offset += b.num_rows() as u64;
        }
        Ok(batch)
    }

    fn offset(&self) -> u64 {
        self.offset
    }

    fn seek(&mut self, offset: u64) -> Result<()> {
        self.iter = None;
        self.item = 0;
        self.pending = None;
        self.offset = offset;
        self.pending = skip_records(|| self.pull(), offset)?;
        Ok(())
    }
}

/// Batches held in Rust (`Dataflow.from_batches`): no Python while it runs.
pub struct BatchesSourceFactory {
    pub batches: Arc<Vec<RecordBatch>>,
}

impl SourceFactory for BatchesSourceFactory {
    fn create(&self, subtask: usize, parallelism: usize) -> Result<Box<dyn Source>> {
        let mine: Vec<RecordBatch> = self
            .batches
            .iter()
            .skip(subtask)
            .step_by(parallelism.max(1))
            .cloned()
            .collect();
        Ok(Box::new(BatchesSource {
            batches: mine,
            next: 0,
            offset: 0,
            pending: None,
        }))
    }
}

struct BatchesSource {
    batches: Vec<RecordBatch>,
    next: usize,
    offset: u64,
    pending: Option<Batch>,
}

impl BatchesSource {
    fn pull(&mut self) -> Option<Batch> {
        let b = self.batches.get(self.next).cloned();
        self.next += 1;
        b
    }
}

impl Source for BatchesSource {
    fn next_batch(&mut self) -> Result<Option<Batch>> {
        let batch = self.pending.take().or_else(|| self.pull());
        if let Some(b) = &batch {
            self.offset += b.num_rows() as u64;
        }
        Ok(batch)
    }

    fn offset(&self) -> u64 {
        self.offset
    }

    fn seek(&mut self, offset: u64) -> Result<()> {
        self.next = 0;
        self.offset = offset;
        self.pending = skip_records(|| Ok(self.pull()), offset)?;
        Ok(())
    }
}
