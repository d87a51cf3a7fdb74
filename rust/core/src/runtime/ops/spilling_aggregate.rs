//! The keyed aggregate operator under a memory budget (issue 37): its
//! accumulators live in a [`StateTable`] that flushes to sorted runs on
//! local disk past the budget ([`StateTable::with_memory_budget`] over a
//! [`LocalRuns`]), folded in by [`KeyedAggregates`], the same vectorised
//! aggregates Spark's keyed state uses. Checkpoints are the table's: O(changed
//! keys) diffs on the newest confirmed checkpoint (the flushed changes
//! included), a full capture every `full_every`-th time.
//!
//! It takes the place of the in-memory [`super::KeyedAggregate`] when a job
//! sets `CheckpointConfig::state_memory`. Both read and write the same state
//! columns (key, one column per aggregate, a mean as `<out>__sum` and
//! `<out>__count`), so either restores the other's snapshots: int32 columns
//! are read as int64 (as the in-memory operator does), and a mean's sum is
//! cast to the type this one keeps (int64 for integer input).
//!
//! Differences that remain: an integer sum that overflows fails the task
//! (the in-memory operator wraps), and a float min/max puts NaN above every
//! number (Spark's order; the in-memory operator skips NaN).

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};

use super::aggregate::{one_full_capture, KeyedAggregate};
use crate::error::{Error, Result};
use crate::operator::{Batch, Emitter, Operator, TaskState};
use crate::protocol::{CheckpointId, InputId};
use crate::runtime::StateMemory;
use crate::snapshot::{StateCapture, StateKind};
use crate::state::{AggFunc, AggSpec, KeyedAggregates, SpillStats, StatePolicy, StateTable};
use crate::store::LocalRuns;

/// The keyed aggregates of one subtask, spilling past a memory budget.
pub struct SpillingAggregate {
    key: String,
    specs: Vec<AggSpec>,
    memory: StateMemory,
    forward: bool,
    full_every: u32,
    /// Created from the first batch's columns (their types fix the state's).
    inner: Option<(KeyedAggregates, StateTable)>,
    /// A restored state that no batch has fixed the input types of yet: a
    /// full capture, then diffs, each with the checkpoint it ends at.
    restored: Vec<(CheckpointId, StateCapture)>,
    /// `restored` is a store's runs, mapped: the table opens them lazily.
    restored_mapped: bool,
    /// The next capture must be full (a restore or an abort happened before
    /// the table existed, or the table is new).
    force_full: bool,
}

impl SpillingAggregate {
    pub(super) fn new(
        key: String,
        specs: Vec<AggSpec>,
        forward: bool,
        full_every: u32,
        memory: StateMemory,
    ) -> Self {
        Self {
            key,
            specs,
            memory,
            forward,
            full_every,
            inner: None,
            restored: Vec::new(),
            restored_mapped: false,
            force_full: false,
        }
    }

    /// Int32 columns the aggregates read (and the key), as int64: the state
    /// types do not depend on which integer width a source produced.
    fn widened(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let schema = batch.schema();
        if !schema
            .fields()
            .iter()
            .any(|f| f.data_type() == &DataType::Int32)
        {
            return Ok(batch.clone());
        }
        let mut fields = Vec::with_capacity(schema.fields().len());
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for (f, c) in schema.fields().iter().zip(batch.columns()) {
            if f.data_type() == &DataType::Int32 {
                fields.push(Field::new(f.name(), DataType::Int64, f.is_nullable()));
                columns.push(cast(c, &DataType::Int64)?);
            } else {
                fields.push(f.as_ref().clone());
                columns.push(c.clone());
            }
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .map_err(|e| Error::Task(format!("aggregate input: {e}")))
    }

    /// The aggregates and their table, made for batches like `batch`; a
    /// state restored before it goes in (cast to the table's types).
    fn init(&mut self, batch: &RecordBatch) -> Result<()> {
        let aggs = KeyedAggregates::new(batch.schema_ref(), &self.key, self.specs.clone())
            .map_err(task)?;
        let mut table = self.new_table(&aggs)?;
        let restored = std::mem::take(&mut self.restored);
        let from_runs = std::mem::take(&mut self.restored_mapped);
        if !restored.is_empty() {
            let (state, diff) = (table.schema(), table.diff_schema());
            let chain = restored
                .into_iter()
                .map(|(id, c)| {
                    let schema = if c.kind == StateKind::Full {
                        &state
                    } else {
                        &diff
                    };
                    let batch = cast_to(&c.batch, schema)?;
                    Ok((
                        id,
                        StateCapture {
                            kind: c.kind,
                            batch,
                            filter: c.filter,
                            times: None,
                        },
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            if from_runs {
                table.restore_mapped(&chain)?;
            } else {
                table.restore(&chain)?;
            }
        }
        // A new table's first checkpoint is full, and so is one after a
        // restore from a single capture, whose checkpoint id is not known
        // here. A store's runs name theirs: the restored checkpoint is the
        // table's confirmed base, and its first checkpoint a diff on it (an
        // abort before this still forces a full).
        self.force_full |= !from_runs;
        self.inner = Some((aggs, table));
        Ok(())
    }

    fn new_table(&self, aggs: &KeyedAggregates) -> Result<StateTable> {
        let policy = StatePolicy {
            full_every: self.full_every,
        };
        let mut table = StateTable::new(aggs.state_schema(), &self.key, policy)?;
        table.confirm_bases();
        let runs = LocalRuns::new(&self.memory.spill_dir)?;
        table.with_memory_budget(self.memory.budget, Box::new(runs))
    }

    /// What spilling did so far (`None` before the first batch).
    pub fn spill_stats(&self) -> Option<SpillStats> {
        self.inner.as_ref().and_then(|(_, t)| t.spill_stats())
    }

    /// The aggregates' output for the state as it stands.
    fn results(&self) -> Result<Option<RecordBatch>> {
        if let Some((aggs, table)) = &self.inner {
            if table.is_empty() {
                return Ok(None);
            }
            return aggs.output(&table.to_batch()).map(Some).map_err(task);
        }
        // Restored and finished with no batch in between: the input types
        // follow from the state's (sum and min/max keep their input's type).
        let Some(state) = self.restored_full()? else {
            return Ok(None);
        };
        let aggs = KeyedAggregates::new(
            &self.input_schema_of(&state)?,
            &self.key,
            self.specs.clone(),
        )
        .map_err(task)?;
        let state = cast_to(&state, &aggs.state_schema())?;
        aggs.output(&state).map(Some).map_err(task)
    }

    /// The restored state whole, before any batch made the table (`None`:
    /// nothing restored). Runs are rebuilt in memory here: only a job that
    /// checkpoints or ends before its first batch after a restore asks.
    fn restored_full(&self) -> Result<Option<RecordBatch>> {
        match self.restored.as_slice() {
            [] => Ok(None),
            [(_, full)] if full.kind == StateKind::Full => Ok(Some(full.batch.clone())),
            runs => crate::store::rebuild_chain(runs).map(Some),
        }
    }

    fn input_schema_of(&self, state: &RecordBatch) -> Result<Schema> {
        let column_type = |name: &str| -> Result<DataType> {
            state
                .schema_ref()
                .field_with_name(name)
                .map(|f| f.data_type().clone())
                .map_err(|_| Error::Snapshot(format!("aggregate state has no column {name:?}")))
        };
        let mut fields = vec![Field::new(&self.key, column_type(&self.key)?, false)];
        for spec in &self.specs {
            let Some(column) = &spec.column else { continue };
            let data_type = match spec.func {
                AggFunc::Count => DataType::Int64,
                AggFunc::Mean => column_type(&format!("{}__sum", spec.output))?,
                _ => column_type(&spec.output)?,
            };
            if fields.iter().all(|f| f.name() != column) {
                fields.push(Field::new(column, data_type, true));
            }
        }
        Ok(Schema::new(fields))
    }
}

impl Operator for SpillingAggregate {
    fn process(&mut self, _input: InputId, batch: Batch, out: &mut dyn Emitter) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let wide = self.widened(&batch)?;
        if self.inner.is_none() {
            self.init(&wide)?;
        }
        let (aggs, table) = self.inner.as_mut().expect("made above");
        aggs.apply(table, &wide).map_err(task)?;
        if self.forward {
            out.emit(batch)?;
        }
        Ok(())
    }

    fn snapshot(&mut self, id: CheckpointId) -> Result<Option<StateCapture>> {
        let Some((_, table)) = self.inner.as_mut() else {
            // No batch yet: the restored state as it was, or no state (with
            // placeholder int64 columns, as the in-memory operator's).
            let batch = match self.restored_full()? {
                Some(state) => state,
                None => KeyedAggregate::new(self.key.clone(), self.specs.clone()).empty_state()?,
            };
            return Ok(Some(StateCapture {
                kind: StateKind::Full,
                batch,
                filter: None,
                times: None,
            }));
        };
        if std::mem::take(&mut self.force_full) {
            table.checkpoint_aborted();
        }
        table.checkpoint(id).map(Some)
    }

    /// As `snapshot`, the table's capture left as runs once they hold part
    /// of its state: the store merges them as it writes the file.
    fn snapshot_runs(&mut self, id: CheckpointId) -> Result<Option<TaskState>> {
        let Some((_, table)) = self.inner.as_mut() else {
            return Ok(self.snapshot(id)?.map(TaskState::Capture));
        };
        if std::mem::take(&mut self.force_full) {
            table.checkpoint_aborted();
        }
        table.checkpoint_streamed(id).map(|c| Some(c.into()))
    }

    fn commit(&mut self, id: CheckpointId) -> Result<()> {
        if let Some((_, table)) = self.inner.as_mut() {
            table.checkpoint_committed(id);
        }
        Ok(())
    }

    fn abort(&mut self, _id: CheckpointId) -> Result<()> {
        // The table's diffs carry every change since the confirmed base, the
        // aborted interval's included; the next capture is full all the
        // same, as the in-memory operator's (a sink may have refused a diff).
        match self.inner.as_mut() {
            Some((_, table)) => table.checkpoint_aborted(),
            None => self.force_full = true,
        }
        Ok(())
    }

    fn set_full_every(&mut self, full_every: u32) {
        self.full_every = full_every.max(1);
    }

    fn restore(&mut self, chain: &[StateCapture]) -> Result<()> {
        let Some(full) = one_full_capture(chain)? else {
            return Ok(());
        };
        self.inner = None;
        self.restored_mapped = false;
        // Captured before a first batch: nothing to restore, and its
        // placeholder types must not fix the table's.
        self.restored = if full.batch.num_rows() > 0 {
            vec![(0, full.clone())]
        } else {
            Vec::new()
        };
        Ok(())
    }

    fn restores_runs(&self) -> bool {
        true
    }

    fn restore_runs(&mut self, runs: &[(CheckpointId, StateCapture)]) -> Result<()> {
        if !matches!(runs.first(), Some((_, c)) if c.kind == StateKind::Full) {
            return Err(Error::Snapshot(
                "keyed aggregate state runs must start with a full capture".into(),
            ));
        }
        self.inner = None;
        // As a lone empty full: state captured before a first batch.
        let empty = runs.iter().all(|(_, c)| c.batch.num_rows() == 0);
        self.restored = if empty { Vec::new() } else { runs.to_vec() };
        self.restored_mapped = !empty;
        self.force_full = false;
        Ok(())
    }

    fn finish(&mut self, out: &mut dyn Emitter) -> Result<()> {
        if self.forward {
            return Ok(());
        }
        if let Some(results) = self.results()? {
            out.emit(results)?;
        }
        Ok(())
    }
}

fn cast(array: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    arrow_cast::cast(array, to).map_err(|e| Error::Snapshot(format!("aggregate state: {e}")))
}

/// `state`'s columns named as `schema`'s, cast to its types (a snapshot of
/// the in-memory operator keeps a mean's sum as float64, int32 input as int64).
fn cast_to(state: &RecordBatch, schema: &arrow_schema::SchemaRef) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let c = state.column_by_name(f.name()).ok_or_else(|| {
                Error::Snapshot(format!(
                    "aggregate state has no column {:?}: was it taken with other aggregates?",
                    f.name()
                ))
            })?;
            cast(c, f.data_type())
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| Error::Snapshot(format!("aggregate state: {e}")))
}

/// The aggregates' refusals (a column of a type they cannot take) are the
/// task's failure here, as the in-memory operator's are.
fn task(e: Error) -> Error {
    match e {
        Error::Config(m) => Error::Task(m),
        other => other,
    }
}

#[cfg(test)]
#[path = "spilling_aggregate_tests.rs"]
mod tests;
