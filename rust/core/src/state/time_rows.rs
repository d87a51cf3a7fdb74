//! A restored base's rows as time index entries, without a [`super::key::Key`]
//! made for each row (issue 37). An entry is a pair of integers that sorts
//! as its (time, key) pair does: an integer key itself, or a byte key's
//! rank in key order (the rows are ranked once; a state file's rows ascend
//! by key already, so their rank is their row). A run's bytes are encoded
//! as the entries are given out; an integer key's from the pair alone, so
//! that giving out entries in time order does not read the key column at
//! random (a cache miss an entry).

use std::sync::Arc;

use arrow_array::builder::BooleanBufferBuilder;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, BinaryArray, BooleanArray, PrimitiveArray, RecordBatch};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};

use super::runs::keys::KeyColumn;
use super::runs::sorted::check_sorted;
use super::runs::KeyRef;
use super::time_index::{encode_ref, run_schema};
use crate::error::{Error, Result};

/// An entry: a row's time and its integer key, or its byte key's rank in
/// key order.
pub(crate) type TimedRow = (i64, i64);

pub(crate) struct TimedRows<'a> {
    times: PrimitiveArray<Int64Type>,
    keys: KeyColumn<'a>,
    /// Byte keys not in key order: each row's rank (rows of one key share
    /// it) and the first row of each rank. `None`: integer keys, or rows
    /// that ascend by key, so that a row's rank is its position.
    ranks: Option<(Vec<u32>, Vec<u32>)>,
    /// Whether the rows ascend by the key an entry holds (integer keys in
    /// order; byte keys held by row), so that a stable sort of a pass's
    /// entries by time alone puts them in (time, key) order.
    in_key_order: bool,
}

impl<'a> TimedRows<'a> {
    /// The rows of a base's time column `times` and key column `keys`
    /// (no null keys: a base's were checked when it was read).
    pub(crate) fn new(times: &dyn Array, keys: &'a dyn Array) -> Result<Self> {
        if times.len() != keys.len() || u32::try_from(keys.len()).is_err() {
            return Err(Error::Config(format!(
                "a base's time index takes a time and a key column of one length under 2^32 \
                 rows; got {} times and {} keys",
                times.len(),
                keys.len()
            )));
        }
        let times = times.as_primitive_opt::<Int64Type>().ok_or_else(|| {
            Error::Config(format!(
                "a time column is Int64 (milliseconds); got {}",
                times.data_type()
            ))
        })?;
        let column = KeyColumn::new(keys)?;
        let ints = matches!(column, KeyColumn::Int64(_) | KeyColumn::Int32(_));
        let ranks = (!ints && check_sorted(keys, "a base").is_err()).then(|| ranked(&column));
        let in_key_order = match &column {
            KeyColumn::Int64(v) => ascending(v),
            KeyColumn::Int32(v) => ascending(v),
            _ => ranks.is_none(),
        };
        Ok(Self {
            times: times.clone(),
            keys: column,
            ranks,
            in_key_order,
        })
    }

    /// Rows with a time: an entry each (a key held twice aside).
    pub(crate) fn timed(&self) -> usize {
        self.times.len() - self.times.null_count()
    }

    /// The entries' count and their encoded bytes, when each row with a
    /// time gives exactly one (no exact duplicate for a sort to drop):
    /// integer keys that ascend strictly, or byte keys in key order (an
    /// entry holds the row). None for byte keys ranked (rows of one key
    /// share an entry's rank).
    pub(crate) fn exact_sizes(&self) -> Option<(usize, u64)> {
        let timed = self.timed();
        let nulls = self.times.nulls().filter(|n| n.null_count() > 0);
        let timed_row = |i: usize| nulls.is_none_or(|n| n.is_valid(i));
        let key_bytes = match (&self.keys, &self.ranks) {
            (KeyColumn::Int64(v), _) => strictly_ascending(v).then_some(8 * timed as u64)?,
            (KeyColumn::Int32(v), _) => strictly_ascending(v).then_some(8 * timed as u64)?,
            (_, Some(_)) => return None,
            (keys, None) => (0..self.times.len())
                .filter(|&i| timed_row(i))
                .map(|i| match keys.at(i) {
                    KeyRef::Bytes(b) => b.len() as u64,
                    KeyRef::Int(_) => 8,
                })
                .sum(),
        };
        Some((timed, 8 * timed as u64 + key_bytes))
    }

    /// Row `row`'s key as an entry holds it.
    fn key_of(&self, row: usize) -> i64 {
        match (&self.keys, &self.ranks) {
            (KeyColumn::Int64(v), _) => v[row],
            (KeyColumn::Int32(v), _) => v[row].into(),
            (_, None) => row as i64,
            (_, Some((rank, _))) => rank[row].into(),
        }
    }

    /// The key an entry holds.
    fn key(&self, held: i64) -> KeyRef<'a> {
        match (&self.keys, &self.ranks) {
            (KeyColumn::Int64(_) | KeyColumn::Int32(_), _) => KeyRef::Int(held),
            (keys, None) => keys.at(held as usize),
            (keys, Some((_, first))) => keys.at(first[held as usize] as usize),
        }
    }

    /// The entries after `lo` up to `hi` (either end open when `None`),
    /// sorted, each once, into `out` (emptied first; its room kept from
    /// one bucket to the next): a pass over the time column, then a radix
    /// sort of the digits that differ (a bucket's times span a fraction of
    /// the range, so a few passes).
    pub(crate) fn between(
        &self,
        lo: Option<TimedRow>,
        hi: Option<TimedRow>,
        out: &mut Vec<TimedRow>,
    ) {
        out.clear();
        if lo.is_none() && hi.is_none() {
            // All of them: sized once, not grown.
            out.reserve(self.timed());
        }
        let range = Range::new(lo, hi);
        match (&self.keys, &self.ranks) {
            (KeyColumn::Int64(v), _) => self.pass(&range, |i| v[i], out),
            (KeyColumn::Int32(v), _) => self.pass(&range, |i| v[i].into(), out),
            (_, None) => self.pass(&range, |i| i as i64, out),
            (_, Some((rank, _))) => self.pass(&range, |i| rank[i].into(), out),
        }
        // A pass gives rows in order: by time alone, if that is key order.
        if self.in_key_order {
            radsort::sort_by_key(out, |p| p.0);
        } else {
            radsort::sort_by_key(out, |&p| p);
        }
        out.dedup();
    }

    /// Every entry, sorted, each once.
    pub(crate) fn all(&self) -> Vec<TimedRow> {
        let mut out = Vec::new();
        self.between(None, None, &mut out);
        out
    }

    /// Appends to `out` the entries of the rows with a time in `range`
    /// (`key`: a row's key as an entry holds it), in row order. Most rows'
    /// times lie outside a bucket's: they cost a compare, their key unread.
    fn pass(&self, range: &Range, key: impl Fn(usize) -> i64, out: &mut Vec<TimedRow>) {
        let values = self.times.values();
        let nulls = self.times.nulls().filter(|n| n.null_count() > 0);
        let (lo_t, hi_t) = (range.lo.0, range.hi.0);
        for (row, &t) in values.iter().enumerate() {
            if t < lo_t || t > hi_t || nulls.is_some_and(|n| n.is_null(row)) {
                continue;
            }
            let p = (t, key(row));
            if range.holds(p) {
                out.push(p);
            }
        }
    }

    /// Every `every`-th row with a time's entry (rows in order), sorted.
    pub(crate) fn sample(&self, every: usize) -> Vec<TimedRow> {
        let values = self.times.values();
        let mut out: Vec<TimedRow> = (0..values.len())
            .filter(|&i| self.times.is_valid(i))
            .step_by(every.max(1))
            .map(|i| (values[i], self.key_of(i)))
            .collect();
        out.sort_unstable();
        out
    }

    /// The run rows of `entries` (sorted, each once), encoded as
    /// [`super::time_index::TIME_KEY`] values.
    pub(crate) fn batch(&self, entries: &[TimedRow]) -> Result<RecordBatch> {
        let mut offsets: Vec<i32> = Vec::with_capacity(entries.len() + 1);
        let mut values: Vec<u8> = Vec::with_capacity(entries.len() * 16);
        offsets.push(0);
        for &(time, held) in entries {
            encode_ref(time, self.key(held), &mut values);
            let end = i32::try_from(values.len()).map_err(|_| {
                Error::Config(format!(
                    "a time index run of {} entries holds over 2 GiB of keys; give the table \
                     a smaller memory budget so its base's times are written in buckets",
                    entries.len()
                ))
            })?;
            offsets.push(end);
        }
        let column = BinaryArray::new(
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            Buffer::from_vec(values),
            None,
        );
        let mut live = BooleanBufferBuilder::new(entries.len());
        live.append_n(entries.len(), false);
        RecordBatch::try_new(
            run_schema(),
            vec![
                Arc::new(column),
                Arc::new(BooleanArray::new(live.finish(), None)),
            ],
        )
        .map_err(|e| Error::Config(format!("building a time index run: {e}")))
    }
}

fn strictly_ascending<T: PartialOrd>(v: &[T]) -> bool {
    v.windows(2).all(|w| w[0] < w[1])
}

fn ascending<T: PartialOrd>(v: &[T]) -> bool {
    v.windows(2).all(|w| w[0] <= w[1])
}

/// The entries after `lo` up to `hi` ((time, key) pairs; an end `None`
/// is open).
struct Range {
    lo: TimedRow,
    hi: TimedRow,
    lo_open: bool,
    hi_open: bool,
}

impl Range {
    fn new(lo: Option<TimedRow>, hi: Option<TimedRow>) -> Self {
        Self {
            lo: lo.unwrap_or((i64::MIN, i64::MIN)),
            hi: hi.unwrap_or((i64::MAX, i64::MAX)),
            lo_open: lo.is_none(),
            hi_open: hi.is_none(),
        }
    }

    fn holds(&self, p: TimedRow) -> bool {
        (self.lo_open || p > self.lo) && (self.hi_open || p <= self.hi)
    }
}

/// Each row's rank in key order and the first row of each rank (rows of
/// one key share a rank: a base in memory may repeat a key).
fn ranked(keys: &KeyColumn<'_>) -> (Vec<u32>, Vec<u32>) {
    let (order, _) = keys.order();
    let mut rank = vec![0u32; order.len()];
    let mut first: Vec<u32> = Vec::new();
    let mut prev: Option<KeyRef<'_>> = None;
    for &row in &order {
        let key = keys.at(row as usize);
        if prev != Some(key) {
            first.push(row);
            prev = Some(key);
        }
        rank[row as usize] = (first.len() - 1) as u32;
    }
    (rank, first)
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int64Array, StringArray};
    use proptest::prelude::*;

    use super::*;
    use crate::state::key::Key;
    use crate::state::time_index::entries_batch;

    fn values(batch: &RecordBatch) -> Vec<Vec<u8>> {
        let column = batch.column(0).as_binary::<i32>();
        column.iter().map(|v| v.unwrap().to_vec()).collect()
    }

    /// What sorting every (time, key) pair gives, each pair once.
    fn reference(times: &[Option<i64>], keys: &[Key]) -> Vec<Vec<u8>> {
        let mut pairs: Vec<(i64, Key)> = times
            .iter()
            .zip(keys)
            .filter_map(|(t, k)| t.map(|t| (t, k.clone())))
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        values(&entries_batch(pairs.iter(), pairs.len()).unwrap())
    }

    proptest! {
        /// Sorted or not, keys repeated or not, int or string keys: the
        /// entries come out as one sort of the (time, key) pairs gives them.
        #[test]
        fn entries_come_in_time_then_key_order(
            rows in prop::collection::vec((prop::option::of(-3i64..4), 0i64..60), 0..200),
            sort_keys in any::<bool>(),
            repeat in any::<bool>(),
            strings in any::<bool>(),
        ) {
            let mut rows = rows;
            if sort_keys {
                // Sorted, keys once or repeated (then integer keys still
                // sort by time alone: a pass gives them in key order).
                rows.sort_by_key(|r| r.1);
                if !repeat {
                    rows.dedup_by_key(|r| r.1);
                }
            }
            let times: Vec<Option<i64>> = rows.iter().map(|r| r.0).collect();
            let time_array = Int64Array::from(times.clone());
            let (keys, key_array): (Vec<Key>, Arc<dyn Array>) = if strings {
                // Zero-padded, so that the strings' order is the numbers'.
                let s: Vec<String> = rows.iter().map(|r| format!("k{:03}", r.1)).collect();
                (
                    s.iter().map(|s| Key::Bytes(Box::from(s.as_bytes()))).collect(),
                    Arc::new(StringArray::from(s)),
                )
            } else {
                (
                    rows.iter().map(|r| Key::Int(r.1)).collect(),
                    Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                )
            };
            let timed = TimedRows::new(&time_array, key_array.as_ref()).unwrap();
            let ascending = rows.windows(2).all(|w| w[0].1 < w[1].1);
            prop_assert_eq!(timed.ranks.is_none(), !strings || ascending);
            let all = timed.all();
            prop_assert_eq!(values(&timed.batch(&all).unwrap()), reference(&times, &keys));
        }
    }

    #[test]
    fn bounds_split_the_entries_between_them() {
        let times = Int64Array::from(vec![Some(2), None, Some(1), Some(2), Some(1)]);
        let keys = Int64Array::from(vec![10, 20, 30, 40, 50]);
        let timed = TimedRows::new(&times, &keys).unwrap();
        assert_eq!(timed.timed(), 4);
        assert_eq!(timed.all(), vec![(1, 30), (1, 50), (2, 10), (2, 40)]);
        assert_eq!(
            {
                let mut out = Vec::new();
                timed.between(Some((1, 30)), Some((2, 10)), &mut out);
                out
            },
            vec![(1, 50), (2, 10)]
        );
        // Rows 0 and 3: every other row with a time.
        assert_eq!(timed.sample(2), vec![(2, 10), (2, 40)]);
        let names = StringArray::from(vec!["a", "b", "c", "d", "e"]);
        let timed = TimedRows::new(&times, &names).unwrap();
        assert_eq!(timed.all(), vec![(1, 2), (1, 4), (2, 0), (2, 3)]);
    }

    #[test]
    fn a_time_column_of_another_type_or_length_is_refused() {
        let keys = Int64Array::from(vec![1, 2]);
        let strings = StringArray::from(vec!["a", "b"]);
        let err = TimedRows::new(&strings, &keys).err().unwrap().to_string();
        assert!(err.contains("Int64"), "{err}");
        let short = Int64Array::from(vec![1]);
        let err = TimedRows::new(&short, &keys).err().unwrap().to_string();
        assert!(err.contains("1 times and 2 keys"), "{err}");
    }

    #[test]
    fn sizes_are_known_ahead_only_when_a_row_with_a_time_is_an_entry() {
        let times = Int64Array::from(vec![Some(3), None, Some(1), Some(3)]);
        let ascending = Int64Array::from(vec![1, 2, 5, 9]);
        let sizes = |keys: &dyn Array| TimedRows::new(&times, keys).unwrap().exact_sizes();
        assert_eq!(sizes(&ascending), Some((3, 48)));
        // A key twice with one time makes one entry: not known ahead.
        assert_eq!(sizes(&Int64Array::from(vec![1, 2, 2, 9])), None);
        // Byte keys in order: 8 bytes of time and the key's own.
        assert_eq!(
            sizes(&StringArray::from(vec!["a", "bb", "ccc", "dddd"])),
            Some((3, 32))
        );
        // Out of order: ranked, rows of one key share an entry.
        assert_eq!(sizes(&StringArray::from(vec!["b", "a", "c", "d"])), None);
    }
}
