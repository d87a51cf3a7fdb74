//! Keyed state tables with incremental diffing (changed keys + tombstones).
//!
//! A [`StateTable`] maps a key column (Int64/Int32/Utf8/Binary) to typed value
//! columns. Every write marks its key changed; [`StateTable::checkpoint`]
//! captures only the changed rows plus tombstones (`__deleted = true`) as an
//! Arrow batch, in O(changed keys), and every `full_every`-th checkpoint the
//! whole table so that restore reads a bounded chain (one full + diffs).
//! Encoding and writing the capture is the store's background job. With
//! several checkpoints in flight, [`StateTable::confirm_bases`] bases each
//! diff on the last checkpoint confirmed complete instead of the last taken.
//!
//! [`KeyedAggregates`] keeps built-in aggregates (count, sum, min, max,
//! mean, first, last) in a table, a batch at a time; [`encode_keys`] makes
//! one Binary key of several key columns.

pub mod aggregate;
mod changelog;
mod column;
#[cfg(test)]
mod confirmed_tests;
mod encode;
mod group;
mod group_index;
mod group_prefix;
#[cfg(test)]
mod group_tests;
pub(crate) mod key;
#[cfg(test)]
mod lookup_tests;
pub mod pickled;
pub mod runs;
#[cfg(test)]
mod spill_group_tests;
#[cfg(test)]
mod spill_tests;
mod table;
mod time_buckets;
pub(crate) use time_buckets::BaseTimeChunks;
pub(crate) use time_index::{run_schema as time_run_schema, TIME_KEY};
mod time_index;
#[cfg(test)]
mod time_index_tests;
mod time_rows;

pub use aggregate::{AggFunc, AggSpec, KeyedAggregates};
pub use encode::encode_keys;
pub use group_prefix::GroupPrefix;
pub use key::Key;
pub use table::{
    check_memory_budget, parse_memory, CaptureRows, InMemoryRuns, RunSink, SpillStats, StatePolicy,
    StateTable, StreamedCapture, DELETED_COLUMN, KEY_METADATA, LIVE_KEYS_METADATA, MAX_RUNS,
    MIN_STATE_MEMORY, TIME_METADATA,
};

/// Whether a [`StateTable`] value column holds `data_type` natively (the
/// one place that says which Arrow types state can be kept as).
pub fn storable_type(data_type: &arrow_schema::DataType) -> bool {
    column::new_column(data_type, true).is_some()
}
