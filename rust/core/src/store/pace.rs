//! A compaction's pace: the [`CompactionBudget`]'s rests taken between
//! the chunks of a merge as well as between jobs, so that the compactor
//! keeps within its share of a core while a long merge (a 10M-key base,
//! seconds of work) is in hand, not only on average over its jobs, as
//! RocksDB's rate limiter paces each write rather than each compaction.

use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Schema, SchemaRef};
use serde_json::Value;

use super::compactor::CompactionBudget;
use super::format::key_json;
use crate::error::{Error, Result};
use crate::state::runs::keys::KeyColumn;
use crate::state::runs::RunChunks;

/// Spans of work and the rests the budget asks for after each.
pub(crate) struct Pacer<'a> {
    budget: CompactionBudget,
    /// Sleeps a span (cut short when the compactor stops).
    sleep: &'a dyn Fn(Duration),
    since: Instant,
    /// Work and rest so far.
    pub(crate) busy: Duration,
    pub(crate) rested: Duration,
    /// Bytes of the spans so far.
    pub(crate) bytes: u64,
}

impl<'a> Pacer<'a> {
    pub(crate) fn new(budget: CompactionBudget, sleep: &'a dyn Fn(Duration)) -> Self {
        Self {
            budget,
            sleep,
            since: Instant::now(),
            busy: Duration::ZERO,
            rested: Duration::ZERO,
            bytes: 0,
        }
    }

    /// Ends the span of work since the last rest, which wrote about
    /// `bytes`: counts it, then rests as the budget asks.
    pub(crate) fn pace(&mut self, bytes: u64) {
        let rest = self.close(bytes);
        if !rest.is_zero() {
            (self.sleep)(rest);
            self.rested += rest;
        }
        self.since = Instant::now();
    }

    /// Ends the span of work since the last rest, which wrote about
    /// `bytes`, and counts it; returns the rest it calls for, for the
    /// caller to take (after handing its output over).
    pub(crate) fn close(&mut self, bytes: u64) -> Duration {
        let work = self.since.elapsed();
        self.busy += work;
        self.bytes += bytes;
        self.since = Instant::now();
        self.budget.rest(work, bytes)
    }
}

/// A merge's chunks read at the pacer's pace: after each chunk, the rest
/// for the work since the last one. It notes the output's first and last
/// key (the merge is in key order) and, for a diff's filter, its keys.
pub(crate) struct PacedChunks<'p, 'a, C> {
    inner: C,
    pacer: &'p mut Pacer<'a>,
    stopping: &'p dyn Fn() -> bool,
    stopped: bool,
    key: String,
    first: Option<Value>,
    last: Option<Value>,
    keys: Option<Vec<ArrayRef>>,
}

impl<'p, 'a, C: RunChunks> PacedChunks<'p, 'a, C> {
    /// `keep_keys`: keep the output's keys ([`Self::key_batches`]).
    pub(crate) fn new(
        inner: C,
        pacer: &'p mut Pacer<'a>,
        stopping: &'p dyn Fn() -> bool,
        keep_keys: bool,
    ) -> Self {
        let key = inner.key_column().to_string();
        Self {
            inner,
            pacer,
            stopping,
            stopped: false,
            key,
            first: None,
            last: None,
            keys: keep_keys.then(Vec::new),
        }
    }

    /// Whether the compactor stopped the merge before its end (the
    /// output is then short: never to be kept).
    pub(crate) fn stopped(&self) -> bool {
        self.stopped
    }

    /// The output's smallest and largest key; `None` for no rows.
    pub(crate) fn key_range(&self) -> Option<(Value, Value)> {
        Some((self.first.clone()?, self.last.clone()?))
    }

    /// The output's keys, a batch of one column a chunk (with
    /// `keep_keys`; empty otherwise).
    pub(crate) fn key_batches(&self) -> Result<Vec<RecordBatch>> {
        let Some(keys) = &self.keys else {
            return Ok(Vec::new());
        };
        let field = self
            .inner
            .schema()
            .field_with_name(&self.key)
            .map_err(|e| Error::Snapshot(format!("a merge's output lacks its key column: {e}")))?;
        let schema: SchemaRef = Schema::new(vec![field.clone()]).into();
        keys.iter()
            .map(|k| {
                RecordBatch::try_new(schema.clone(), vec![k.clone()])
                    .map_err(|e| Error::Snapshot(format!("a merge's keys: {e}")))
            })
            .collect()
    }

    fn note(&mut self, chunk: &RecordBatch) -> Result<()> {
        let Some(keys) = chunk.column_by_name(&self.key) else {
            return Err(Error::Snapshot(format!(
                "a merge's chunk lacks its key column '{}'",
                self.key
            )));
        };
        let column = KeyColumn::new(keys.as_ref())?;
        if column.len() > 0 {
            if self.first.is_none() {
                self.first = Some(key_json(column.at(0)));
            }
            self.last = Some(key_json(column.at(column.len() - 1)));
        }
        if let Some(kept) = self.keys.as_mut() {
            kept.push(keys.clone());
        }
        Ok(())
    }
}

impl<C: RunChunks> RunChunks for PacedChunks<'_, '_, C> {
    fn schema(&self) -> &SchemaRef {
        self.inner.schema()
    }

    fn key_column(&self) -> &str {
        &self.key
    }

    fn next_chunk(&mut self, max_rows: usize) -> Result<Option<RecordBatch>> {
        if (self.stopping)() {
            self.stopped = true;
            return Err(Error::Snapshot(
                "the compactor stopped during a merge".into(),
            ));
        }
        let Some(chunk) = self.inner.next_chunk(max_rows)? else {
            return Ok(None);
        };
        self.note(&chunk)?;
        self.pacer.pace(chunk.get_array_memory_size() as u64);
        Ok(Some(chunk))
    }

    fn release_inputs(&self) {
        self.inner.release_inputs();
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::sync::Arc;

    use arrow_array::{BooleanArray, Int64Array};
    use arrow_schema::{DataType, Field};

    use super::*;
    use crate::state::runs::{MergeCursor, Run};
    use crate::state::DELETED_COLUMN;

    /// A run of `keys` (their values the keys); a diff (upserts only)
    /// unless `base`.
    fn run(keys: impl IntoIterator<Item = i64>, base: bool) -> Run {
        let keys: Int64Array = keys.into_iter().collect();
        let mut fields = vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ];
        let mut columns: Vec<ArrayRef> = vec![Arc::new(keys.clone()), Arc::new(keys.clone())];
        if !base {
            fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
            columns.push(Arc::new(BooleanArray::from(vec![false; keys.len()])));
        }
        let batch = RecordBatch::try_new(Schema::new(fields).into(), columns).unwrap();
        Run::from_unsorted_unfiltered(batch, "k").unwrap()
    }

    #[test]
    fn a_merge_rests_after_each_chunk_as_the_budget_asks() {
        let slept = RefCell::new(Vec::new());
        let sleep = |d: Duration| slept.borrow_mut().push(d);
        let quarter = CompactionBudget {
            cpu_share: 0.25,
            bytes_per_s: None,
        };
        let mut pacer = Pacer::new(quarter, &sleep);
        let (newer, older) = (run((0..10_000).step_by(2), false), run(0..10_000, true));
        let runs = [&newer, &older];
        let cursor = MergeCursor::new(&runs, true).unwrap();
        let never = || false;
        let mut paced = PacedChunks::new(cursor, &mut pacer, &never, true);
        let mut rows = 0;
        while let Some(chunk) = paced.next_chunk(1_000).unwrap() {
            rows += chunk.num_rows();
        }
        assert_eq!(rows, 10_000);
        assert_eq!(
            paced.key_range(),
            Some((Value::from(0), Value::from(9_999)))
        );
        let keys = paced.key_batches().unwrap();
        assert_eq!(
            keys.iter().map(RecordBatch::num_rows).sum::<usize>(),
            10_000
        );
        assert_eq!(keys[0].schema().field(0).name(), "k");
        // One rest a chunk, each three times the work before it.
        let (busy, rested) = (pacer.busy, pacer.rested);
        let slept = slept.into_inner();
        assert_eq!(slept.len(), 10);
        assert_eq!(rested, slept.iter().sum::<Duration>());
        let ratio = rested.as_secs_f64() / busy.as_secs_f64();
        assert!((ratio - 3.0).abs() < 1e-6, "rested {ratio}× the work");
    }

    #[test]
    fn a_byte_rate_rests_for_the_bytes_of_each_chunk() {
        let slept = RefCell::new(Duration::ZERO);
        let sleep = |d: Duration| *slept.borrow_mut() += d;
        // 1 byte/s: each chunk's rest is about its bytes in seconds.
        let slow = CompactionBudget {
            cpu_share: 1.0,
            bytes_per_s: Some(1),
        };
        let mut pacer = Pacer::new(slow, &sleep);
        let only = run(0..100, true);
        let runs = [&only];
        let cursor = MergeCursor::new(&runs, true).unwrap();
        let never = || false;
        let mut paced = PacedChunks::new(cursor, &mut pacer, &never, false);
        let chunk = paced.next_chunk(100).unwrap().unwrap();
        let bytes = chunk.get_array_memory_size() as u64;
        assert!(paced.next_chunk(100).unwrap().is_none());
        assert!(paced.key_batches().unwrap().is_empty());
        let rested = slept.into_inner();
        assert!(rested <= Duration::from_secs(bytes));
        assert!(rested > Duration::from_secs(bytes - 1));
    }

    #[test]
    fn a_stop_ends_the_merge_with_an_error_not_a_short_output() {
        let sleep = |_: Duration| {};
        let mut pacer = Pacer::new(CompactionBudget::UNBOUNDED, &sleep);
        let only = run(0..10, true);
        let runs = [&only];
        let cursor = MergeCursor::new(&runs, true).unwrap();
        let stop = || true;
        let mut paced = PacedChunks::new(cursor, &mut pacer, &stop, false);
        let err = paced.next_chunk(4).unwrap_err().to_string();
        assert!(err.contains("stopped"), "{err}");
        assert!(paced.stopped());
        assert_eq!(paced.key_range(), None);
        drop(paced);
        assert_eq!(pacer.rested, Duration::ZERO);
    }
}
