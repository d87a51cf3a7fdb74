//! `_GraphBuilder`: the Python `Dataflow` states its graph through this, one
//! call per vertex and edge, then runs it.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use pyo3_arrow::PyRecordBatch;
use snapcut_core::graph::{LogicalGraph, Partitioning, VertexId};
use snapcut_core::runtime::ops::{self, AggFunc, AggSpec, Collected};
use snapcut_core::runtime::{
    run_durable, DurableOptions, InMemorySnapshots, Job, JobHandle, JobOptions, RestartStrategy,
};
use snapcut_core::Error;

use super::config::PyCheckpointConfig;
use super::control::PyJobControl;
use super::keyed::KeyedProcessFactory;
use super::report::{self, PyCheckpoint};
use super::source::{BatchesSourceFactory, PyIterSourceFactory};
use super::udf::{UdfFactory, UdfKind};
use crate::errors::IntoPyResult;

#[pyclass(module = "snapcut._core", name = "_GraphBuilder")]
pub struct GraphBuilder {
    pub(super) graph: LogicalGraph,
    /// `collect` sinks' result names and handles.
    collects: Vec<(String, Collected)>,
    /// Set once the job has run: a builder runs once.
    ran: bool,
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
            ran: false,
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
        // Refuse a key its state file could not hold now, not at run time.
        snapcut_core::state::pickled::PickledState::new(&key).map_py()?;
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
        Ok(self
            .graph
            .add_operator(name, check_parallelism(parallelism)?, ops::union()))
    }

    /// The head of an iteration: merges the input and the feedback edge.
    fn add_iteration_head(&mut self, name: String, parallelism: usize) -> PyResult<VertexId> {
        self.add_union(name, parallelism)
    }

    /// The built-in `(user, dwell_ms)` generator.
    fn add_dwell_events(
        &mut self,
        name: String,
        parallelism: usize,
        users: u64,
        count: u64,
        seed: u64,
        batch_size: usize,
    ) -> PyResult<VertexId> {
        let factory = ops::dwell_source(count, users, seed, batch_size).map_py()?;
        Ok(self
            .graph
            .add_source(name, check_parallelism(parallelism)?, factory))
    }

    /// Built-in keyed aggregates; `specs` are `(output, func, column or None)`.
    /// With `forward`, a streaming stage: each input batch is passed on
    /// after it is folded into the state, and no final rows are emitted.
    #[pyo3(signature = (name, parallelism, key, specs, forward=false))]
    fn add_aggregate(
        &mut self,
        name: String,
        parallelism: usize,
        key: String,
        specs: Vec<(String, String, Option<String>)>,
        forward: bool,
    ) -> PyResult<VertexId> {
        let specs = specs
            .into_iter()
            .map(|(output, func, column)| {
                let func = match func.as_str() {
                    "count" => AggFunc::Count,
                    "sum" => AggFunc::Sum,
                    "min" => AggFunc::Min,
                    "max" => AggFunc::Max,
                    "mean" => AggFunc::Mean,
                    other => {
                        return Err(Error::Config(format!(
                            "unknown aggregate {other:?}; use count, sum, min, max or mean"
                        )))
                    }
                };
                Ok(AggSpec::new(
                    func,
                    column.unwrap_or_else(|| key.clone()),
                    output,
                ))
            })
            .collect::<Result<Vec<_>, Error>>()
            .map_py()?;
        let factory = if forward {
            ops::keyed_aggregate_forwarding(key, specs)
        } else {
            ops::keyed_aggregate(key, specs)
        }
        .map_py()?;
        Ok(self
            .graph
            .add_operator(name, check_parallelism(parallelism)?, factory))
    }

    /// An in-memory sink whose batches become `results[result]`.
    fn add_collect(
        &mut self,
        name: String,
        parallelism: usize,
        result: String,
    ) -> PyResult<VertexId> {
        let (factory, collected) = ops::collect_sink();
        self.collects.push((result, collected));
        Ok(self
            .graph
            .add_operator(name, check_parallelism(parallelism)?, factory))
    }

    /// Arrow IPC files `<path>/part-<subtask>.arrow`.
    fn add_arrow_sink(
        &mut self,
        name: String,
        parallelism: usize,
        path: String,
    ) -> PyResult<VertexId> {
        let factory = ops::ipc_file_sink(path).map_py()?;
        Ok(self
            .graph
            .add_operator(name, check_parallelism(parallelism)?, factory))
    }

    /// Runs the job to completion with the GIL released (Python operators
    /// take it back per batch), optionally from a checkpoint of an identical
    /// graph; returns the raw report.
    ///
    /// With `checkpoint_dir`, checkpoints go to a durable store there;
    /// `resume` starts from its newest intact checkpoint; failures restart
    /// the job from the last checkpoint up to `restart_attempts` times.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (checkpointing, restore_from=None, checkpoint_dir=None, resume=false, restart_attempts=0, restart_delay=1.0, failover="region", control=None, fsync="syncfs", channel_capacity=64, failure=None, direct_io=true))]
    fn run<'py>(
        &mut self,
        py: Python<'py>,
        checkpointing: &PyCheckpointConfig,
        restore_from: Option<PyRef<'_, PyCheckpoint>>,
        checkpoint_dir: Option<std::path::PathBuf>,
        resume: bool,
        restart_attempts: u32,
        restart_delay: f64,
        failover: &str,
        control: Option<PyRef<'_, PyJobControl>>,
        fsync: &str,
        channel_capacity: usize,
        failure: Option<(String, usize, String, u64)>,
        direct_io: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let current: Arc<std::sync::Mutex<Option<JobHandle>>> =
            control.map(|c| Arc::clone(&c.current)).unwrap_or_default();
        if self.ran {
            return Err(Error::Config(
                "a graph builder runs once; build the Dataflow again".into(),
            ))
            .map_py();
        }
        let options = JobOptions {
            channel_capacity,
            failover: failover.parse().map_py()?,
            restart: RestartStrategy {
                attempts: restart_attempts,
                delay: Duration::try_from_secs_f64(restart_delay).map_err(|_| {
                    crate::errors::to_py(Error::Config(format!(
                        "restart_delay must be a finite, non-negative number of seconds, got {restart_delay}"
                    )))
                })?,
            },
            ..Default::default()
        };
        self.ran = true;
        let mut graph = std::mem::take(&mut self.graph);
        if let Some((vertex, subtask, at, nth)) = failure {
            let fault = snapcut_core::runtime::ops::Fault {
                vertex,
                subtask,
                at: at.parse().map_py()?,
                nth,
            };
            snapcut_core::runtime::ops::inject(&mut graph, &fault).map_py()?;
        }
        if let Some(root) = checkpoint_dir {
            if restore_from.is_some() {
                return Err(Error::Config(
                    "restore_from and checkpoint_dir cannot be combined; use resume=True to \
                     restore from the checkpoint directory"
                        .into(),
                ))
                .map_py();
            }
            let durable = DurableOptions {
                resume,
                fsync: fsync.parse().map_py()?,
                direct_io,
                ..DurableOptions::new(root)
            };
            let config = checkpointing.inner.clone();
            let setter = Arc::clone(&current);
            let outcome = run_interruptibly(py, &current, move || {
                let mut on_start = |h: JobHandle| {
                    *setter.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
                };
                run_durable(graph, config, options, &durable, &mut on_start)
            })?;
            let d = report::to_py(py, &outcome.report, &self.collects, &[])?;
            d.set_item("restored_from", outcome.restored_from)?;
            let skipped: Vec<(u64, String)> = outcome
                .skipped
                .iter()
                .map(|s| (s.id, s.reason.clone()))
                .collect();
            d.set_item("skipped", skipped)?;
            d.set_item("restarts", report::restarts_to_py(&outcome.restarts))?;
            return Ok(d);
        }
        if resume {
            return Err(Error::Config(
                "resume needs a checkpoint_dir to restore from".into(),
            ))
            .map_py();
        }
        let mut job = Job::new(graph, checkpointing.inner.clone(), options).map_py()?;
        let restore_from_id = restore_from.as_ref().map(|c| c.inner.meta.id);
        if let Some(checkpoint) = restore_from {
            job = job.restore_from(&checkpoint.inner).map_py()?;
        }
        *current.lock().unwrap_or_else(|e| e.into_inner()) = Some(job.handle());
        let sink = Arc::new(InMemorySnapshots::new());
        let job_sink: Arc<dyn snapcut_core::snapshot::SnapshotSink> = sink.clone();
        let job_report = run_interruptibly(py, &current, move || job.run(job_sink))?;
        let d = report::to_py(py, &job_report, &self.collects, &sink.completed())?;
        d.set_item("restored_from", restore_from_id)?;
        d.set_item("skipped", Vec::<(u64, String)>::new())?;
        d.set_item("restarts", report::restarts_to_py(&job_report.restarts))?;
        Ok(d)
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

/// Runs `work` (a job, or a durable run with its restarts) on its own
/// thread with the GIL released, waking every 100 ms to let Python handle
/// signals: Ctrl-C cancels the attempt `current` holds and raises
/// `KeyboardInterrupt` instead of leaving the interpreter stuck in Rust.
fn run_interruptibly<T: Send + 'static>(
    py: Python<'_>,
    current: &std::sync::Mutex<Option<JobHandle>>,
    work: impl FnOnce() -> snapcut_core::Result<T> + Send + 'static,
) -> PyResult<T> {
    use std::sync::mpsc::{channel, RecvTimeoutError};
    let (tx, rx) = channel();
    // A Receiver is not Sync; detach() needs to borrow it across threads.
    let rx = std::sync::Mutex::new(rx);
    let recv = |timeout: Option<Duration>| {
        let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
        match timeout {
            Some(t) => rx.recv_timeout(t),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        }
    };
    let runner = std::thread::Builder::new()
        .name("snapcut-job".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| Error::io("spawning the job thread", e))
        .map_py()?;
    loop {
        match py.detach(|| recv(Some(Duration::from_millis(100)))) {
            Ok(outcome) => {
                let _ = runner.join();
                return outcome.map_py();
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Err(interrupt) = py.check_signals() {
                    if let Some(h) = current.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                        let _ = h.cancel();
                    }
                    let _ = py.detach(|| recv(None));
                    let _ = runner.join();
                    return Err(interrupt);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                let _ = runner.join();
                return Err(Error::Task("the job thread panicked".into())).map_py();
            }
        }
    }
}
