//! What a task runs: sources, operators and sinks, as traits.
//!
//! Built-in operators (generator source, keyed aggregates, Arrow file sink)
//! live in snapcut-core; Python-backed ones (UDF map/filter/flat_map, keyed
//! Python state, iterable sources) live in the bindings crate and implement
//! the same traits, so the runtime never knows the difference.

use arrow_array::RecordBatch;

use crate::error::{Error, Result};
use crate::protocol::{CheckpointId, InputId};
use crate::runtime::StateMemory;
use crate::snapshot::{StateCapture, StateRuns};
use crate::state::{CaptureRows, SpillStats, StreamedCapture};

/// The unit of data on every channel: a columnar batch of records.
pub type Batch = RecordBatch;

/// Where an operator sends its results; the runtime partitions them onto
/// the output channels.
pub trait Emitter {
    fn emit(&mut self, batch: Batch) -> Result<()>;

    /// Emits on output `port` (see `LogicalGraph::set_output_port`); port 0
    /// is what [`Emitter::emit`] uses. A port with no edges drops the batch.
    fn emit_to(&mut self, port: usize, batch: Batch) -> Result<()> {
        if port == 0 {
            self.emit(batch)
        } else {
            Err(crate::error::Error::Task(format!(
                "this emitter has no output port {port}"
            )))
        }
    }
}

/// A task's state at a checkpoint: in memory, or runs the sink merges.
#[derive(Clone, Debug)]
pub enum TaskState {
    Capture(StateCapture),
    Runs(StateRuns),
}

impl From<StreamedCapture> for TaskState {
    fn from(c: StreamedCapture) -> Self {
        match c.rows {
            CaptureRows::Batch(batch) => Self::Capture(StateCapture {
                kind: c.kind,
                batch,
                filter: None,
                times: None,
            }),
            CaptureRows::Runs { runs, schema, .. } => Self::Runs(StateRuns {
                kind: c.kind,
                runs,
                schema,
            }),
        }
    }
}

/// A data-processing step of one subtask. Called from its task thread only.
pub trait Operator: Send {
    /// Processes one batch that arrived on `input`.
    fn process(&mut self, input: InputId, batch: Batch, out: &mut dyn Emitter) -> Result<()>;

    /// Sync phase of a checkpoint: captures this subtask's state. `None` for
    /// stateless operators. Must not block on I/O.
    fn snapshot(&mut self, _id: CheckpointId) -> Result<Option<StateCapture>> {
        Ok(None)
    }

    /// As [`Self::snapshot`], for an operator whose state may be left as
    /// sorted runs for the sink to merge as it writes, off the task thread
    /// and never whole in memory (a spilling table: [`TaskState::Runs`]).
    /// By default the in-memory capture.
    fn snapshot_runs(&mut self, id: CheckpointId) -> Result<Option<TaskState>> {
        Ok(self.snapshot(id)?.map(TaskState::Capture))
    }

    /// Restores the state of a checkpoint: a full capture followed by the
    /// diffs that apply on top of it, oldest first.
    fn restore(&mut self, _chain: &[StateCapture]) -> Result<()> {
        Ok(())
    }

    /// Whether this operator restores a stored state from its runs as they
    /// are ([`Self::restore_runs`]); otherwise the runtime rebuilds them
    /// into one full capture for [`Self::restore`]. Asked after
    /// [`Self::set_state_memory`].
    fn restores_runs(&self) -> bool {
        false
    }

    /// Restores a stored state from its runs (mapped state files that no
    /// one writes again: a full, then diffs, oldest first, each with the
    /// checkpoint whose state it ends at), opening them lazily. Called only
    /// where [`Self::restores_runs`] is true.
    fn restore_runs(&mut self, _runs: &[(CheckpointId, StateCapture)]) -> Result<()> {
        Err(Error::Snapshot(
            "this operator does not restore from runs; restore it from one full capture".into(),
        ))
    }

    /// Every input has ended: emit whatever is held back (e.g. final aggregates).
    fn finish(&mut self, _out: &mut dyn Emitter) -> Result<()> {
        Ok(())
    }

    /// Two-phase commit, phase one: stage output up to barrier `id` (sinks).
    fn pre_commit(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// Two-phase commit, phase two: checkpoint `id` completed; publish what was staged.
    fn commit(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// Checkpoint `id` will never complete: what its snapshot captured was
    /// not stored (incremental state must take a full capture next time).
    fn abort(&mut self, _id: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// Called once before anything else: every `full_every`-th checkpoint of
    /// incremental state is a full capture (`CheckpointConfig::full_every`).
    fn set_full_every(&mut self, _full_every: u32) {}

    /// Keyed state past `memory.budget` bytes spills to sorted runs under
    /// `memory.spill_dir`. Set before any batch or restore. Operators whose
    /// state cannot spill keep it in memory (the default). Fails if the
    /// spill directory cannot be made.
    fn set_state_memory(&mut self, _memory: &StateMemory) -> Result<()> {
        Ok(())
    }

    /// What spilling did so far, for operators whose state spills.
    fn spill_stats(&self) -> Option<SpillStats> {
        None
    }
}

/// A replayable source subtask: its position is a record offset.
pub trait Source: Send {
    /// The next batch, or `None` once the (bounded) source is exhausted.
    fn next_batch(&mut self) -> Result<Option<Batch>>;
    /// Records emitted so far; recorded in checkpoints.
    fn offset(&self) -> u64;
    /// Continues from `offset` (on restore).
    fn seek(&mut self, offset: u64) -> Result<()>;
}

/// Makes one [`Operator`] per subtask.
pub trait OperatorFactory: Send + Sync {
    fn create(&self, subtask: usize, parallelism: usize) -> Result<Box<dyn Operator>>;
}

/// Makes one [`Source`] per subtask.
pub trait SourceFactory: Send + Sync {
    fn create(&self, subtask: usize, parallelism: usize) -> Result<Box<dyn Source>>;
}

impl<F> OperatorFactory for F
where
    F: Fn(usize, usize) -> Result<Box<dyn Operator>> + Send + Sync,
{
    fn create(&self, subtask: usize, parallelism: usize) -> Result<Box<dyn Operator>> {
        self(subtask, parallelism)
    }
}
