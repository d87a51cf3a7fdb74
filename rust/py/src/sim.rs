//! Bindings of the deterministic Chandy–Lamport bank simulator
//! (`snapcut_core::sim::bank`). The typed facade is `snapcut.sim`.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use snapcut_core::protocol::{InputKind, ProtocolKind};
use snapcut_core::sim::bank::{Bank, Message, ProcId, RandomBank, Topology};
use snapcut_core::sim::dataflow::{self, DataflowConfig};
use snapcut_core::sim::timed::{self, CostModel, TimedConfig};

use crate::errors::IntoPyResult;

/// A bank of processes sending money over FIFO channels, with Chandy–Lamport
/// snapshots; every step is scripted or drawn from a seeded PRNG.
#[pyclass(module = "snapcut._core", name = "BankSim")]
pub struct BankSim {
    inner: Bank,
}

fn message(m: Message) -> (&'static str, i64) {
    match m {
        Message::Money(amount) => ("money", amount),
        Message::Marker(id) => ("marker", id as i64),
    }
}

impl BankSim {
    fn name(&self, p: ProcId) -> String {
        self.inner.names()[p].clone()
    }

    fn pair(&self, (s, d): (ProcId, ProcId)) -> (String, String) {
        (self.name(s), self.name(d))
    }
}

#[pymethods]
impl BankSim {
    #[new]
    #[pyo3(signature = (balances, topology=None, seed=0))]
    fn new(
        balances: Vec<(String, i64)>,
        topology: Option<Vec<(String, String)>>,
        seed: u64,
    ) -> PyResult<Self> {
        let inner = Bank::new(&balances, topology.as_deref(), seed).map_py()?;
        Ok(BankSim { inner })
    }

    #[staticmethod]
    #[pyo3(signature = (processes=8, seed=0, balance=1000, topology="complete", max_transfers=None))]
    fn random(
        processes: usize,
        seed: u64,
        balance: i64,
        topology: &str,
        max_transfers: Option<u64>,
    ) -> PyResult<Self> {
        let topology: Topology = topology.parse().map_py()?;
        let cfg = RandomBank {
            processes,
            seed,
            balance,
            topology,
            max_transfers,
        };
        Ok(BankSim {
            inner: Bank::random(&cfg).map_py()?,
        })
    }

    #[getter]
    fn names(&self) -> Vec<String> {
        self.inner.names().to_vec()
    }

    #[getter]
    fn edges(&self) -> Vec<(String, String)> {
        self.inner
            .edges()
            .into_iter()
            .map(|e| self.pair(e))
            .collect()
    }

    #[getter]
    fn balances(&self) -> Vec<i64> {
        self.inner.balances().to_vec()
    }

    #[getter]
    fn total(&self) -> i64 {
        self.inner.total()
    }

    #[getter]
    fn terminated(&self) -> bool {
        self.inner.is_terminated()
    }

    fn halted(&self, process: &str) -> PyResult<bool> {
        let p = self.inner.process(process).map_py()?;
        Ok(self.inner.is_halted(p))
    }

    fn send(&mut self, src: &str, dst: &str, amount: i64) -> PyResult<()> {
        let s = self.inner.process(src).map_py()?;
        let d = self.inner.process(dst).map_py()?;
        self.inner.send(s, d, amount).map_py()
    }

    fn halt(&mut self, process: &str) -> PyResult<()> {
        let p = self.inner.process(process).map_py()?;
        self.inner.halt(p);
        Ok(())
    }

    fn start_snapshot(&mut self, process: &str) -> PyResult<u64> {
        let p = self.inner.process(process).map_py()?;
        Ok(self.inner.start_snapshot(p))
    }

    fn deliver(&mut self, src: &str, dst: &str) -> PyResult<(&'static str, i64)> {
        let s = self.inner.process(src).map_py()?;
        let d = self.inner.process(dst).map_py()?;
        self.inner.deliver(s, d).map(message).map_py()
    }

    fn in_flight(&self, src: &str, dst: &str) -> PyResult<Vec<(&'static str, i64)>> {
        let s = self.inner.process(src).map_py()?;
        let d = self.inner.process(dst).map_py()?;
        let msgs = self.inner.in_flight(s, d).map_py()?;
        Ok(msgs.into_iter().map(message).collect())
    }

    fn snapshot_ids(&self) -> Vec<u64> {
        self.inner.snapshots().keys().copied().collect()
    }

    /// Snapshot `id` as a dict of plain values (the facade wraps it).
    fn snapshot<'py>(&self, py: Python<'py>, id: u64) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.snapshot(id).map_py()?;
        let d = PyDict::new(py);
        d.set_item("id", s.id)?;
        d.set_item("initiator", self.name(s.initiator))?;
        d.set_item("complete", s.complete)?;
        let order: Vec<String> = s.order.iter().map(|&p| self.name(p)).collect();
        d.set_item("order", order)?;
        let processes = PyDict::new(py);
        let halted = PyDict::new(py);
        for (&p, rec) in &s.processes {
            processes.set_item(self.name(p), rec.balance)?;
            halted.set_item(self.name(p), rec.halted)?;
        }
        d.set_item("processes", processes)?;
        d.set_item("halted", halted)?;
        let channels = PyDict::new(py);
        for (&c, msgs) in &s.channels {
            channels.set_item(self.pair(c), msgs.clone())?;
        }
        d.set_item("channels", channels)?;
        let sent = PyDict::new(py);
        for (&c, &n) in &s.sent {
            sent.set_item(self.pair(c), n)?;
        }
        d.set_item("sent", sent)?;
        let received = PyDict::new(py);
        for (&c, &n) in &s.received {
            received.set_item(self.pair(c), n)?;
        }
        d.set_item("received", received)?;
        Ok(d)
    }

    /// Checks snapshot `id` against every amount ever sent; returns the
    /// problem found, or None.
    fn verify(&self, id: u64) -> Option<String> {
        self.inner.verify(id).err()
    }

    fn step(&mut self) -> bool {
        self.inner.step()
    }

    #[pyo3(signature = (steps, snapshot_every=None))]
    fn run(
        &mut self,
        py: Python<'_>,
        steps: u64,
        snapshot_every: Option<u64>,
    ) -> PyResult<Vec<u64>> {
        let inner = &mut self.inner;
        py.detach(|| inner.run(steps, snapshot_every)).map_py()
    }

    fn drain(&mut self, py: Python<'_>) -> Vec<u64> {
        let inner = &mut self.inner;
        py.detach(|| inner.drain())
    }
}

/// Runs the dataflow-mode simulator (every protocol over random DAGs or
/// cycles) and returns its report as a dict of plain values.
#[pyfunction]
#[pyo3(signature = (
    protocol, seed=0, *, vertices=6, sources=2, back_edges=0, extra_edges=3,
    tokens_per_source=30, checkpoints=5, max_hops=6, end_of_stream=false,
    aligned_first=false, abort_one_in=0,
))]
#[allow(clippy::too_many_arguments)]
fn simulate_dataflow<'py>(
    py: Python<'py>,
    protocol: &str,
    seed: u64,
    vertices: usize,
    sources: usize,
    back_edges: usize,
    extra_edges: usize,
    tokens_per_source: u64,
    checkpoints: u64,
    max_hops: u32,
    end_of_stream: bool,
    aligned_first: bool,
    abort_one_in: u32,
) -> PyResult<Bound<'py, PyDict>> {
    let protocol: ProtocolKind = protocol.parse().map_py()?;
    let cfg = DataflowConfig {
        protocol,
        aligned_first,
        seed,
        vertices,
        sources,
        back_edges,
        extra_edges,
        tokens_per_source,
        checkpoints,
        max_hops,
        end_of_stream,
        abort_one_in,
    };
    let r = py.detach(|| dataflow::run(&cfg)).map_py()?;
    let d = PyDict::new(py);
    d.set_item("steps", r.steps)?;
    let edges: Vec<(usize, usize, bool)> = r
        .edges
        .iter()
        .map(|&(s, t, k)| (s, t, k == InputKind::BackEdge))
        .collect();
    d.set_item("edges", edges)?;
    d.set_item("tokens_emitted", r.tokens_emitted)?;
    d.set_item("tokens_delivered", r.tokens_delivered)?;
    let ckpts: Vec<(u64, bool, bool, u64)> = r
        .checkpoints
        .iter()
        .map(|c| (c.id, c.completed, c.aborted, c.logged))
        .collect();
    d.set_item("checkpoints", ckpts)?;
    d.set_item("timeouts_fired", r.timeouts_fired)?;
    d.set_item("violation", r.violation)?;
    Ok(d)
}

/// Runs the failover simulator: a random DAG with several two-phase-commit
/// sinks, `failures` task failures at random steps, restarted by the
/// runtime's failover rule; the report as a dict of plain values.
#[pyfunction]
#[pyo3(signature = (
    protocol, failover, seed=0, *, vertices=7, sources=2, merge_percent=20,
    tokens_per_source=20, failures=2, dedup=true,
))]
#[allow(clippy::too_many_arguments)]
fn simulate_failover<'py>(
    py: Python<'py>,
    protocol: &str,
    failover: &str,
    seed: u64,
    vertices: usize,
    sources: usize,
    merge_percent: u32,
    tokens_per_source: u64,
    failures: usize,
    dedup: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = snapcut_core::sim::failover::FailoverConfig {
        protocol: protocol.parse().map_py()?,
        strategy: failover.parse().map_py()?,
        seed,
        vertices,
        sources,
        merge_percent,
        tokens_per_source,
        failures,
        dedup,
    };
    let r = py
        .detach(|| snapcut_core::sim::failover::run(&cfg))
        .map_py()?;
    let d = PyDict::new(py);
    d.set_item("edges", r.edges)?;
    d.set_item("published", r.published.into_iter().collect::<Vec<_>>())?;
    d.set_item("counts", r.counts)?;
    d.set_item("failures", r.failures)?;
    d.set_item("checkpoints_completed", r.checkpoints_completed)?;
    d.set_item("restored_from", r.restored_from)?;
    d.set_item("replayed_dropped", r.replayed_dropped)?;
    d.set_item("violation", r.violation)?;
    Ok(d)
}

/// The cost model's fields by name, each with a getter and a setter, so the
/// dict form and the struct cannot drift apart.
macro_rules! cost_fields {
    ($($name:ident),* $(,)?) => {
        const COST_FIELDS: &[&str] = &[$(stringify!($name)),*];

        fn cost_to_dict<'py>(py: Python<'py>, c: &CostModel) -> PyResult<Bound<'py, PyDict>> {
            let d = PyDict::new(py);
            $(d.set_item(stringify!($name), c.$name)?;)*
            Ok(d)
        }

        fn set_cost(c: &mut CostModel, name: &str, value: f64) -> bool {
            match name {
                $(stringify!($name) => c.$name = value,)*
                _ => return false,
            }
            true
        }
    };
}

cost_fields!(
    record_s,
    jitter,
    chunk_records,
    buffer_records,
    net_latency_s,
    channel_latency_s,
    net_bytes_per_s,
    record_bytes,
    state_bytes_per_key,
    write_bytes_per_s,
    write_latency_s,
    capture_s_per_key,
    background_slowdown,
    ack_s,
    commit_s,
);

/// The timed simulator's default cost model, as a dict of floats.
#[pyfunction]
fn default_cost_model(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    cost_to_dict(py, &CostModel::default())
}

/// Runs the timed simulator (the experiments' job on `nodes` machines, in
/// simulated time) and returns its report as a dict of plain values.
#[pyfunction]
#[pyo3(signature = (protocol, nodes, records_per_node, keys_per_node, interval_s=None, *, seed=0, cost=None))]
#[allow(clippy::too_many_arguments)]
fn simulate_scaling<'py>(
    py: Python<'py>,
    protocol: &str,
    nodes: usize,
    records_per_node: u64,
    keys_per_node: u64,
    interval_s: Option<f64>,
    seed: u64,
    cost: Option<std::collections::HashMap<String, f64>>,
) -> PyResult<Bound<'py, PyDict>> {
    let protocol: ProtocolKind = protocol.parse().map_py()?;
    let mut model = CostModel::default();
    for (name, value) in cost.unwrap_or_default() {
        if !set_cost(&mut model, &name, value) {
            return Err(snapcut_core::Error::Config(format!(
                "unknown cost model field {name:?}; use any of: {}",
                COST_FIELDS.join(", ")
            )))
            .map_py();
        }
    }
    let cfg = TimedConfig {
        protocol,
        nodes,
        records_per_node,
        keys_per_node,
        interval_s,
        seed,
        cost: model,
    };
    let r = py.detach(|| timed::run(&cfg)).map_py()?;
    let d = PyDict::new(py);
    d.set_item("runtime_s", r.runtime_s)?;
    d.set_item("records", r.records)?;
    d.set_item("throughput_rps", r.throughput_rps)?;
    d.set_item("checkpoints", r.checkpoints)?;
    d.set_item("checkpoint_s", r.checkpoint_s)?;
    d.set_item("paused_s", r.paused_s)?;
    d.set_item("max_pause_s", r.max_pause_s)?;
    d.set_item("alignment_max_s", r.alignment_max_s)?;
    d.set_item("state_bytes_max", r.state_bytes_max)?;
    d.set_item("events", r.events)?;
    d.set_item("cost", cost_to_dict(py, &cfg.cost)?)?;
    Ok(d)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BankSim>()?;
    m.add_function(wrap_pyfunction!(default_cost_model, m)?)?;
    m.add_function(wrap_pyfunction!(simulate_scaling, m)?)?;
    m.add_function(wrap_pyfunction!(simulate_failover, m)?)?;
    m.add_function(wrap_pyfunction!(simulate_dataflow, m)?)
}
