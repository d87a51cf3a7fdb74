//! The deterministic `(user, dwell_ms)` generator of the dwell-time job.

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};
use crate::operator::{Batch, Source, SourceFactory};

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Record number `i` (global, 0-based) of the generated stream:
/// `(user in 0..users, dwell_ms in 0..10_000)`. Every subtask split gives the
/// same records, so a single-threaded loop over `0..total` is the reference.
#[inline]
pub fn dwell_record(seed: u64, i: u64, users: u64) -> (i64, i64) {
    let h = splitmix64(seed ^ i.wrapping_mul(0xd1b5_4a32_d192_ed03));
    // Multiply-shift instead of `% users`: no division on the hot path.
    let user = ((h as u128 * users as u128) >> 64) as i64;
    (user, (h as u32 % 10_000) as i64)
}

/// `user: int64, dwell_ms: int64`, both non-null.
pub fn dwell_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("user", DataType::Int64, false),
        Field::new("dwell_ms", DataType::Int64, false),
    ]))
}

/// Subtask `s` of `p` emits records `s, s+p, s+2p, ...` below `total`.
pub struct DwellSource {
    seed: u64,
    users: u64,
    subtask: u64,
    parallelism: u64,
    /// Records this subtask emits in all.
    count: u64,
    /// Records emitted so far (the replay offset).
    offset: u64,
    batch_size: usize,
    schema: SchemaRef,
}

impl DwellSource {
    pub fn new(
        total: u64,
        users: u64,
        seed: u64,
        batch_size: usize,
        subtask: usize,
        parallelism: usize,
    ) -> Self {
        let (s, p) = (subtask as u64, parallelism as u64);
        let count = if s < total {
            (total - s).div_ceil(p)
        } else {
            0
        };
        Self {
            seed,
            users,
            subtask: s,
            parallelism: p,
            count,
            offset: 0,
            batch_size,
            schema: dwell_schema(),
        }
    }
}

impl Source for DwellSource {
    fn next_batch(&mut self) -> Result<Option<Batch>> {
        let n = (self.count - self.offset).min(self.batch_size as u64) as usize;
        if n == 0 {
            return Ok(None);
        }
        let mut users = Vec::with_capacity(n);
        let mut dwell = Vec::with_capacity(n);
        let (seed, nu, p) = (self.seed, self.users, self.parallelism);
        let mut i = self.subtask + self.offset * p;
        for _ in 0..n {
            let (u, d) = dwell_record(seed, i, nu);
            users.push(u);
            dwell.push(d);
            i += p;
        }
        self.offset += n as u64;
        let batch = RecordBatch::try_new(
            self.schema.clone(),
            vec![
                Arc::new(Int64Array::from(users)),
                Arc::new(Int64Array::from(dwell)),
            ],
        )
        .map_err(|e| Error::Task(format!("generator: {e}")))?;
        Ok(Some(batch))
    }

    fn offset(&self) -> u64 {
        self.offset
    }

    fn seek(&mut self, offset: u64) -> Result<()> {
        if offset > self.count {
            return Err(Error::Snapshot(format!(
                "generator offset {offset} is past the end of subtask {} ({} records)",
                self.subtask, self.count
            )));
        }
        self.offset = offset;
        Ok(())
    }
}

struct DwellFactory {
    total: u64,
    users: u64,
    seed: u64,
    batch_size: usize,
}

impl SourceFactory for DwellFactory {
    fn create(&self, subtask: usize, parallelism: usize) -> Result<Box<dyn Source>> {
        Ok(Box::new(DwellSource::new(
            self.total,
            self.users,
            self.seed,
            self.batch_size,
            subtask,
            parallelism,
        )))
    }
}

/// The dwell-time generator: `total` records over `users` users, in batches
/// of `batch_size` (1024 in the benchmarks), reproducible from `seed`.
pub fn dwell_source(
    total: u64,
    users: u64,
    seed: u64,
    batch_size: usize,
) -> Result<Arc<dyn SourceFactory>> {
    if users == 0 || batch_size == 0 {
        return Err(Error::Config(format!(
            "dwell source needs users >= 1 and batch_size >= 1 (got users={users}, batch_size={batch_size})"
        )));
    }
    Ok(Arc::new(DwellFactory {
        total,
        users,
        seed,
        batch_size,
    }))
}
