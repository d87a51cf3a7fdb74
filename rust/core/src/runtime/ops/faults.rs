//! Injected task failures for chaos tests: a wrapper that makes one subtask
//! of an operator fail once, at a chosen call (a batch, a checkpoint's
//! capture, a commit). A SIGKILL stops a whole process; this stops one task
//! thread, which is what a failover strategy reacts to.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::graph::{LogicalGraph, VertexKind};
use crate::operator::{Batch, Emitter, Operator, OperatorFactory};
use crate::protocol::{CheckpointId, InputId};
use crate::runtime::StateMemory;
use crate::snapshot::StateCapture;
use crate::state::SpillStats;

/// Where in a task's life the failure strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAt {
    /// Processing its n-th batch.
    Process,
    /// Mid-checkpoint: its n-th state capture was taken (and staged by a
    /// two-phase-commit sink), the task has not acknowledged it.
    Checkpoint,
    /// Mid-commit: its n-th checkpoint completed, the task has not
    /// published (committed) what it staged for it.
    Commit,
}

impl FaultAt {
    pub const ALL: [FaultAt; 3] = [Self::Process, Self::Checkpoint, Self::Commit];

    pub fn name(self) -> &'static str {
        match self {
            Self::Process => "process",
            Self::Checkpoint => "checkpoint",
            Self::Commit => "commit",
        }
    }
}

impl FromStr for FaultAt {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                Error::Config(format!(
                "unknown failure point {s:?}; use \"process\" (the n-th batch), \"checkpoint\" \
                 (the n-th state capture) or \"commit\" (the n-th commit)"
            ))
            })
    }
}

/// One injected failure: subtask `subtask` of `vertex` fails at its `nth`
/// call of `at` (1-based), once per job (restarts included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub vertex: String,
    pub subtask: usize,
    pub at: FaultAt,
    pub nth: u64,
}

/// Whether an injected failure fired (shared with the wrapped operators).
#[derive(Clone, Debug, Default)]
pub struct Fired(Arc<AtomicBool>);

impl Fired {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Wraps `fault.vertex` of `graph` so that `fault` happens; the returned
/// flag says whether it did.
pub fn inject(graph: &mut LogicalGraph, fault: &Fault) -> Result<Fired> {
    if fault.nth == 0 {
        return Err(Error::Config(format!(
            "failure of {}-{} at {}: nth counts from 1",
            fault.vertex,
            fault.subtask,
            fault.at.name()
        )));
    }
    let names: Vec<String> = graph.vertices.iter().map(|v| v.name.clone()).collect();
    let Some(v) = graph.vertices.iter_mut().find(|v| v.name == fault.vertex) else {
        return Err(Error::Config(format!(
            "cannot inject a failure into {:?}: no such operator (operators: {})",
            fault.vertex,
            names.join(", ")
        )));
    };
    if fault.subtask >= v.parallelism {
        return Err(Error::Config(format!(
            "cannot inject a failure into {}-{}: it has {} subtasks",
            fault.vertex, fault.subtask, v.parallelism
        )));
    }
    let VertexKind::Operator(inner) = &v.kind else {
        return Err(Error::Config(format!(
            "cannot inject a failure into source {:?}: only operators and sinks take one",
            fault.vertex
        )));
    };
    let fired = Fired::default();
    v.kind = VertexKind::Operator(Arc::new(Faulty {
        inner: inner.clone(),
        fault: fault.clone(),
        calls: Arc::new(AtomicU64::new(0)),
        fired: fired.clone(),
    }));
    Ok(fired)
}

struct Faulty {
    inner: Arc<dyn OperatorFactory>,
    fault: Fault,
    /// Calls of `fault.at` by the subtask, over its restarts.
    calls: Arc<AtomicU64>,
    fired: Fired,
}

impl OperatorFactory for Faulty {
    fn create(&self, subtask: usize, parallelism: usize) -> Result<Box<dyn Operator>> {
        let op = self.inner.create(subtask, parallelism)?;
        if subtask != self.fault.subtask {
            return Ok(op);
        }
        Ok(Box::new(FaultyOperator {
            inner: op,
            fault: self.fault.clone(),
            calls: self.calls.clone(),
            fired: self.fired.clone(),
        }))
    }
}

struct FaultyOperator {
    inner: Box<dyn Operator>,
    fault: Fault,
    calls: Arc<AtomicU64>,
    fired: Fired,
}

impl FaultyOperator {
    fn strike(&self, at: FaultAt) -> Result<()> {
        if at != self.fault.at || self.fired.get() {
            return Ok(());
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fault.nth && !self.fired.0.swap(true, Ordering::SeqCst) {
            return Err(Error::Task(format!(
                "injected failure at {} #{n}",
                at.name()
            )));
        }
        Ok(())
    }
}

impl Operator for FaultyOperator {
    fn process(&mut self, input: InputId, batch: Batch, out: &mut dyn Emitter) -> Result<()> {
        self.strike(FaultAt::Process)?;
        self.inner.process(input, batch, out)
    }
    fn snapshot(&mut self, id: CheckpointId) -> Result<Option<StateCapture>> {
        self.inner.snapshot(id)
    }
    fn pre_commit(&mut self, id: CheckpointId) -> Result<()> {
        self.inner.pre_commit(id)?;
        self.strike(FaultAt::Checkpoint)
    }
    fn commit(&mut self, id: CheckpointId) -> Result<()> {
        self.strike(FaultAt::Commit)?;
        self.inner.commit(id)
    }
    fn abort(&mut self, id: CheckpointId) -> Result<()> {
        self.inner.abort(id)
    }
    fn restore(&mut self, chain: &[StateCapture]) -> Result<()> {
        self.inner.restore(chain)
    }
    fn restores_runs(&self) -> bool {
        self.inner.restores_runs()
    }
    fn restore_runs(&mut self, runs: &[(CheckpointId, StateCapture)]) -> Result<()> {
        self.inner.restore_runs(runs)
    }
    fn finish(&mut self, out: &mut dyn Emitter) -> Result<()> {
        self.inner.finish(out)
    }
    fn set_full_every(&mut self, full_every: u32) {
        self.inner.set_full_every(full_every)
    }
    fn set_state_memory(&mut self, memory: &StateMemory) -> Result<()> {
        self.inner.set_state_memory(memory)
    }
    fn spill_stats(&self) -> Option<SpillStats> {
        self.inner.spill_stats()
    }
}
