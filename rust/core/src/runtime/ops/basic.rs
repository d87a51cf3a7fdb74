//! Stateless built-ins: union, a batch map and an iteration step.

use std::sync::Arc;

use crate::error::Result;
use crate::operator::{Batch, Emitter, Operator, OperatorFactory};
use crate::protocol::InputId;

struct Union;

impl Operator for Union {
    fn process(&mut self, _input: InputId, batch: Batch, out: &mut dyn Emitter) -> Result<()> {
        out.emit(batch)
    }
}

/// Passes batches from all its inputs through (schemas should agree).
pub fn union() -> Arc<dyn OperatorFactory> {
    Arc::new(|_, _| Ok(Box::new(Union) as Box<dyn Operator>))
}

type MapFn = dyn Fn(Batch) -> Result<Option<Batch>> + Send + Sync;

struct Map(Arc<MapFn>);

impl Operator for Map {
    fn process(&mut self, _input: InputId, batch: Batch, out: &mut dyn Emitter) -> Result<()> {
        match (self.0)(batch)? {
            Some(b) => out.emit(b),
            None => Ok(()),
        }
    }
}

/// Applies `f` to every batch; `None` drops it. An `Err` stops the job.
pub fn map_batches(
    f: impl Fn(Batch) -> Result<Option<Batch>> + Send + Sync + 'static,
) -> Arc<dyn OperatorFactory> {
    let f: Arc<MapFn> = Arc::new(f);
    Arc::new(move |_, _| Ok(Box::new(Map(f.clone())) as Box<dyn Operator>))
}

/// The output port of [`iterate`] for results leaving the loop.
pub const ITERATE_OUTPUT_PORT: usize = 0;
/// The output port of [`iterate`] for records going round again; connect it
/// with `connect_feedback` and `set_output_port(edge, ITERATE_FEEDBACK_PORT)`.
pub const ITERATE_FEEDBACK_PORT: usize = 1;

type StepFn = dyn Fn(Batch) -> Result<(Option<Batch>, Option<Batch>)> + Send + Sync;

struct Iterate(Arc<StepFn>);

impl Operator for Iterate {
    fn process(&mut self, _input: InputId, batch: Batch, out: &mut dyn Emitter) -> Result<()> {
        let (again, done) = (self.0)(batch)?;
        if let Some(b) = again {
            out.emit_to(ITERATE_FEEDBACK_PORT, b)?;
        }
        if let Some(b) = done {
            out.emit_to(ITERATE_OUTPUT_PORT, b)?;
        }
        Ok(())
    }
}

/// One step of an iteration: `step(batch) -> (feed back, emit)`. Records
/// fed back arrive again (on the feedback input) until none are left.
pub fn iterate(
    step: impl Fn(Batch) -> Result<(Option<Batch>, Option<Batch>)> + Send + Sync + 'static,
) -> Arc<dyn OperatorFactory> {
    let f: Arc<StepFn> = Arc::new(step);
    Arc::new(move |_, _| Ok(Box::new(Iterate(f.clone())) as Box<dyn Operator>))
}
