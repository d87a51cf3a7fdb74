//! `_GraphBuilder`: the Python `Dataflow` states its graph through this, one
//! call per vertex and edge, then runs it.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3_arrow::PyRecordBatch;
use snapcut_core::graph::{LogicalGraph, Partitioning, VertexId};
use snapcut_core::runtime::operator::Operator;
use snapcut_core::Error;

use super::keyed::KeyedProcessFactory;
use super::source::{BatchesSourceFactory, PyIterSourceFactory};
use super::udf::{UdfFactory, UdfKind};
use super::union::Union;
use crate::errors::IntoPyResult;

#[pyclass(module = "snapcut._core", name = "_GraphBuilder")]
pub struct GraphBuilder {
    pub(super) graph: LogicalGraph,
    /// Result names of `collect` sinks, by vertex.
    pub(super) collects: Vec<(VertexId, String)>,
}

fn check_parallelism(parallelism: usize) -> PyResult<usize> {
    if parallelism == 0 {
        return Err(Error::Config("parallelism must be at least 1".into())).map_py();
    }
    Ok(parallelism)
}

#[pymethods]
impl GraphBuilder {
    #[new]
    fn new() -> Self {
        Self {
            graph: LogicalGraph::new(),
            collects: Vec::new(),
        }
    }

    /// A source re-created by `make_iter()` (an iterator of RecordBatches).
    fn add_python_source(
        &mut self,
        name: String,
        parallelism: usize,
        make_iter: Py<PyAny>,
    ) -> PyResult<VertexId> {
        let factory = PyIterSourceFactory {
            name: name.clone(),
            make_iter: Arc::new(make_iter),
        };
        Ok(self
            .graph
            .add_source(name, check_parallelism(parallelism)?, Arc::new(factory)))
    }

    /// A source of batches held in Rust.
    fn add_batches_source(
        &mut self,
        name: String,
        parallelism: usize,
        batches: Vec<PyRecordBatch>,
    ) -> PyResult<VertexId> {
        let batches = batches.into_iter().map(PyRecordBatch::into_inner).collect();
        let factory = BatchesSourceFactory {
            batches: Arc::new(batches),
        };
        Ok(self
            .graph
            .add_source(name, check_parallelism(parallelism)?, Arc::new(factory)))
    }

    /// `kind` is `"map"`, `"filter"` or `"flat_map"`.
    fn add_udf(
        &mut self,
        name: String,
        parallelism: usize,
        kind: &str,
        func: Py<PyAny>,
    ) -> PyResult<VertexId> {
        let factory = UdfFactory {
            name: name.clone(),
            kind: kind.parse::<UdfKind>().map_py()?,
            func: Arc::new(func),
        };
        Ok(self
            .graph
            .add_operator(name, check_parallelism(parallelism)?, Arc::new(factory)))
    }

    /// `func(key, batch, state) -> (output, new_state)` on rows hashed by `key`.
    fn add_keyed_process(
        &mut self,
        name: String,
        parallelism: usize,
        key: String,
        func: Py<PyAny>,
    ) -> PyResult<VertexId> {
        let factory = KeyedProcessFactory {
            name: name.clone(),
            key,
            func: Arc::new(func),
        };
        Ok(self
            .graph
            .add_operator(name, check_parallelism(parallelism)?, Arc::new(factory)))
    }

    fn add_union(&mut self, name: String, parallelism: usize) -> PyResult<VertexId> {
        let factory = |_: usize, _: usize| -> snapcut_core::Result<Box<dyn Operator>> {
            Ok(Box::new(Union))
        };
        Ok(self
            .graph
            .add_operator(name, check_parallelism(parallelism)?, Arc::new(factory)))
    }

    /// `partitioning`: `"forward"`, `"hash"` (with `key`), `"broadcast"`, `"round_robin"`.
    #[pyo3(signature = (from_vertex, to_vertex, partitioning, key=None, feedback=false))]
    fn connect(
        &mut self,
        from_vertex: VertexId,
        to_vertex: VertexId,
        partitioning: &str,
        key: Option<String>,
        feedback: bool,
    ) -> PyResult<usize> {
        let p = match (partitioning, key) {
            ("forward", None) => Partitioning::Forward,
            ("hash", Some(key)) => Partitioning::Hash { key },
            ("broadcast", None) => Partitioning::Broadcast,
            ("round_robin", None) => Partitioning::RoundRobin,
            (other, key) => {
                return Err(Error::Graph(format!(
                    "bad partitioning {other:?} (key {key:?}); use forward, hash with a key, \
                     broadcast or round_robin"
                )))
                .map_py()
            }
        };
        let n = self.graph.vertices.len();
        if from_vertex >= n || to_vertex >= n {
            return Err(Error::Graph(format!(
                "edge {from_vertex}->{to_vertex} names a vertex that does not exist"
            )))
            .map_py();
        }
        Ok(if feedback {
            self.graph.connect_feedback(from_vertex, to_vertex, p)
        } else {
            self.graph.connect(from_vertex, to_vertex, p)
        })
    }
}
