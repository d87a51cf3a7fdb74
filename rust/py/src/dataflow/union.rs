//! `union`: every input's batches pass through unchanged.

use snapcut_core::protocol::InputId;
use snapcut_core::runtime::operator::{Batch, Emitter, Operator};
use snapcut_core::Result;

pub struct Union;

impl Operator for Union {
    fn process(&mut self, _input: InputId, batch: Batch, out: &mut dyn Emitter) -> Result<()> {
        out.emit(batch)
    }
}
