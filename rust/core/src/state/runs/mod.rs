//! Sorted runs: the immutable levels of the keyed state store (issue 37). A
//! run is a state file whose rows are sorted by key, each key once, with the
//! run's key range and a filter beside it, so a batch's lookups skip the runs
//! that cannot hold its keys and search the rest together. The store keeps a
//! mutable table in memory over a [`RunSet`] (newest run first) and compacts
//! neighbouring runs with [`merge()`]. Pure rules, no I/O: the files are the
//! store's (`crate::store`).
//!
//! - [`hash`]: XXH64, the keys' filter hash (fixed by the format);
//! - [`filter`]: Parquet's split-block bloom filter;
//! - [`sorted`]: batched lookups in a sorted key column, and its check;
//! - [`keys`]: keys read in place in sort order, and a run's key range;
//! - [`run`]: one run (a sorted batch with tombstones, or a base without),
//!   its range and filter;
//! - [`set`]: the runs of a state, newest first, and batched lookups in them;
//! - [`merge`](mod@merge): compaction, a k-way merge where the newest row wins;
//! - [`ordered`]: a batch given out a chunk at a time in a run's order.

pub mod filter;
pub mod hash;
pub mod keys;
pub mod merge;
#[cfg(test)]
mod model_tests;
pub mod ordered;
pub mod run;
pub mod set;
pub mod sorted;
#[cfg(test)]
mod tests;

pub use filter::BloomFilter;
pub use keys::{key_buckets, KeyRange, KeyRef};
pub use merge::{merge, merge_rows, MergeCursor, MergeStats, Merged, RunChunks};
pub use ordered::OrderedChunks;
pub use run::{build_filter, run_order, Pages, Run, DEFAULT_FPP};
pub use set::{Lookup, LookupStats, RunSet};
