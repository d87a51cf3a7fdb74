//! Keyed built-in aggregates (count, sum, min, max, mean of a value column
//! grouped by a key column). Accumulators are columnar (one `Vec` per
//! aggregate, indexed by a key's slot), so a batch costs one hash lookup per
//! row plus tight loops. Final results are emitted in `finish`; a snapshot
//! is incremental: the keys touched since the last *confirmed* checkpoint
//! as a diff based on it (`StateKind::Diff`, O(changed keys)), and every
//! `full_every`-th time (or while no capture was confirmed yet, or when
//! at least half the keys changed: `full_beats_diff`, or when the chain's
//! diffs would hold as many rows as the table: `full_beats_chain`) the
//! whole table (`StateKind::Full`).
//!
//! Why the last confirmed one, not the last captured one: with
//! `max_concurrent > 1` checkpoint n+1 is captured before n is known to
//! have completed, and n may still be aborted (timeout, failed write). A diff
//! on top of n would then have no stored base. Like RocksDB incremental
//! checkpoints in Flink, a diff is relative to the newest checkpoint whose
//! completion was confirmed (`Operator::commit`), and carries every change
//! since then, whatever happened to the captures in between.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type};
use arrow_array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use rustc_hash::FxHashMap;

use super::dirty::DirtySlots;
use super::spilling_aggregate::SpillingAggregate;
use crate::error::{Error, Result};
use crate::operator::{Batch, Emitter, Operator, OperatorFactory};
use crate::protocol::{CheckpointId, InputId};
use crate::runtime::StateMemory;
use crate::snapshot::{full_beats_diff, StateCapture, StateKind, FULL_BEATS_DIFF_MIN_KEYS};
use crate::state::{SpillStats, DELETED_COLUMN, KEY_METADATA, LIVE_KEYS_METADATA};

pub use crate::state::{AggFunc, AggSpec};

enum Keys {
    Unknown,
    Int(FxHashMap<i64, u32>, Vec<i64>),
    Str(FxHashMap<String, u32>, Vec<String>),
}

/// One aggregate's accumulators, by slot.
enum Acc {
    Count(Vec<i64>),
    SumI(Vec<i64>),
    SumF(Vec<f64>),
    MinI(Vec<Option<i64>>),
    MaxI(Vec<Option<i64>>),
    MinF(Vec<Option<f64>>),
    MaxF(Vec<Option<f64>>),
    Mean(Vec<f64>, Vec<i64>),
}

impl Acc {
    fn new(func: AggFunc, float: bool) -> Self {
        match (func, float) {
            (AggFunc::Count, _) => Acc::Count(Vec::new()),
            (AggFunc::Sum, false) => Acc::SumI(Vec::new()),
            (AggFunc::Sum, true) => Acc::SumF(Vec::new()),
            (AggFunc::Min, false) => Acc::MinI(Vec::new()),
            (AggFunc::Max, false) => Acc::MaxI(Vec::new()),
            (AggFunc::Min, true) => Acc::MinF(Vec::new()),
            (AggFunc::Max, true) => Acc::MaxF(Vec::new()),
            (AggFunc::Mean, _) => Acc::Mean(Vec::new(), Vec::new()),
            // Only the empty state before a first batch gets here (`init`
            // rejects first/last): an empty nullable column like min's.
            (AggFunc::First | AggFunc::Last, _) => Acc::MinI(Vec::new()),
        }
    }

    fn grow(&mut self, n: usize) {
        match self {
            Acc::Count(v) | Acc::SumI(v) => v.resize(n, 0),
            Acc::SumF(v) => v.resize(n, 0.0),
            Acc::MinI(v) | Acc::MaxI(v) => v.resize(n, None),
            Acc::MinF(v) | Acc::MaxF(v) => v.resize(n, None),
            Acc::Mean(s, c) => {
                s.resize(n, 0.0);
                c.resize(n, 0);
            }
        }
    }
}

/// Values of a column, read as `i64` or `f64`.
enum Values<'a> {
    I64(&'a [i64], Option<&'a dyn Array>),
    I32(&'a [i32], Option<&'a dyn Array>),
    F64(&'a [f64], Option<&'a dyn Array>),
}

fn values<'a>(col: &'a ArrayRef, name: &str) -> Result<Values<'a>> {
    let nulls = (col.null_count() > 0).then_some(col.as_ref());
    Ok(match col.data_type() {
        DataType::Int64 => Values::I64(col.as_primitive::<Int64Type>().values(), nulls),
        DataType::Int32 => Values::I32(col.as_primitive::<Int32Type>().values(), nulls),
        DataType::Float64 => Values::F64(col.as_primitive::<Float64Type>().values(), nulls),
        other => {
            return Err(Error::Task(format!(
                "aggregate column {name:?} has type {other}; use int64, int32 or float64"
            )))
        }
    })
}

#[inline]
fn fold<T: Copy>(
    slots: &[u32],
    vals: &[T],
    nulls: Option<&dyn Array>,
    mut f: impl FnMut(usize, T),
) {
    match nulls {
        None => {
            for (&s, &v) in slots.iter().zip(vals) {
                f(s as usize, v);
            }
        }
        Some(a) => {
            for (i, (&s, &v)) in slots.iter().zip(vals).enumerate() {
                if a.is_valid(i) {
                    f(s as usize, v);
                }
            }
        }
    }
}

fn update(acc: &mut Acc, slots: &[u32], vals: &Values<'_>) {
    macro_rules! each {
        ($f:expr) => {
            match vals {
                Values::I64(v, n) => fold(slots, v, *n, |s, x| $f(s, x as i64, x as f64)),
                Values::I32(v, n) => fold(slots, v, *n, |s, x| $f(s, x as i64, x as f64)),
                Values::F64(v, n) => fold(slots, v, *n, |s, x| $f(s, x as i64, x)),
            }
        };
    }
    match acc {
        Acc::Count(c) => each!(|s: usize, _i: i64, _f: f64| c[s] += 1),
        Acc::SumI(a) => each!(|s: usize, i: i64, _f: f64| a[s] = a[s].wrapping_add(i)),
        Acc::SumF(a) => each!(|s: usize, _i: i64, f: f64| a[s] += f),
        Acc::MinI(a) => {
            each!(|s: usize, i: i64, _f: f64| a[s] = Some(a[s].map_or(i, |m| m.min(i))))
        }
        Acc::MaxI(a) => {
            each!(|s: usize, i: i64, _f: f64| a[s] = Some(a[s].map_or(i, |m| m.max(i))))
        }
        Acc::MinF(a) => {
            each!(|s: usize, _i: i64, f: f64| a[s] = Some(a[s].map_or(f, |m| m.min(f))))
        }
        Acc::MaxF(a) => {
            each!(|s: usize, _i: i64, f: f64| a[s] = Some(a[s].map_or(f, |m| m.max(f))))
        }
        Acc::Mean(sum, cnt) => each!(|s: usize, _i: i64, f: f64| {
            sum[s] += f;
            cnt[s] += 1;
        }),
    }
}

/// The keyed aggregate operator of one subtask.
pub struct KeyedAggregate {
    key: String,
    specs: Vec<AggSpec>,
    keys: Keys,
    accs: Vec<Acc>,
    slots: Vec<u32>,
    /// Slots touched since the last capture.
    dirty: DirtySlots,
    /// Captures taken but not (yet) confirmed: the slots touched in the
    /// interval each one closed. A diff carries all of them.
    unconfirmed: BTreeMap<CheckpointId, Epoch>,
    /// The newest confirmed capture (the base of the next diff), the
    /// diffs in its chain and their rows, if any.
    confirmed: Option<(CheckpointId, Chain)>,
    /// A capture was aborted: the next one is full (see `abort`).
    force_full: bool,
    full_every: u32,
    /// Pass every input batch on, unchanged, after folding it in (a
    /// streaming stateful stage); then `finish` emits nothing.
    forward: bool,
    /// Under a memory budget, this operator is the spilling one: every call
    /// goes there (`set_state_memory`).
    spilling: Option<Box<SpillingAggregate>>,
}

/// What one capture closed: the slots touched since the capture before it
/// (`None`: every slot).
#[derive(Debug, Default)]
struct Epoch {
    slots: Option<Vec<u32>>,
    chain: Chain,
}

/// The diffs a capture's chain holds on its full (none: it was full).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Chain {
    diffs: u32,
    rows: usize,
}

/// Whether a diff of `changed` rows on a chain whose diffs hold
/// `chain_rows` is written as a full of the table's `live` rows instead:
/// once the chain's diffs would hold as many rows as the table. This
/// operator's full is a copy of its columns, no dearer on the task thread
/// than gathering as many changed rows; the chain it ends would otherwise
/// grow until the store's compactor rewrote the table from it in the
/// background, reading the full and every diff back (at 10M keys, with a
/// third of the keys changing each second, ~4.8 s of CPU a run out of the
/// two cores the job uses: bench/results/state_store/direct_io/).
/// A restore reads at most about twice the table.
fn full_beats_chain(chain_rows: usize, changed: usize, live: usize) -> bool {
    live >= FULL_BEATS_DIFF_MIN_KEYS && chain_rows.saturating_add(changed) >= live
}

fn ka_len(cols: &[ArrayRef]) -> usize {
    cols.first().map_or(0, |c| c.len())
}

fn pick<T: Clone>(v: &[T], slots: Option<&[u32]>) -> Vec<T> {
    match slots {
        None => v.to_vec(),
        Some(s) => s.iter().map(|&i| v[i as usize].clone()).collect(),
    }
}

impl KeyedAggregate {
    pub fn new(key: impl Into<String>, specs: Vec<AggSpec>) -> Self {
        Self {
            key: key.into(),
            specs,
            keys: Keys::Unknown,
            accs: Vec::new(),
            slots: Vec::new(),
            dirty: DirtySlots::default(),
            unconfirmed: BTreeMap::new(),
            confirmed: None,
            force_full: false,
            full_every: 1,
            forward: false,
            spilling: None,
        }
    }

    /// The state of an operator that has seen no batch: placeholder int64
    /// key and value columns.
    pub(super) fn empty_state(&self) -> Result<RecordBatch> {
        self.state(None)
    }

    /// This operator passes each input batch on after folding it into its
    /// state, and emits no final rows: a stateful stage of a pipeline.
    pub fn forwarding(mut self) -> Self {
        self.forward = true;
        self
    }

    fn mark_dirty(&mut self) {
        // Every capture is full: nothing to track.
        if self.full_every > 1 {
            let capacity = self.len();
            self.dirty.mark(&self.slots, capacity);
        }
    }

    /// The slots changed since the confirmed capture, ascending (a diff
    /// lists keys in insertion order, like a full capture), or `None` if
    /// that is so much of the table that a full is written instead
    /// ([`full_beats_diff`]; keys are never removed). Checks the open
    /// interval first: with hot keys it covers them all.
    fn changed_unless_most_keys(&self) -> Option<Vec<u32>> {
        let len = self.len();
        if self.dirty.covers_all(len) || full_beats_diff(self.dirty.len(), len) {
            return None;
        }
        let earlier: Option<Vec<&[u32]>> = self
            .unconfirmed
            .values()
            .map(|e| e.slots.as_deref())
            .collect();
        let changed = self.dirty.union(earlier?, len);
        let every = len > 0 && changed.len() == len;
        (!every && !full_beats_diff(changed.len(), len)).then_some(changed)
    }

    fn len(&self) -> usize {
        match &self.keys {
            Keys::Unknown => 0,
            Keys::Int(_, k) => k.len(),
            Keys::Str(_, k) => k.len(),
        }
    }

    /// Fixes key and accumulator types from the first batch.
    fn init(&mut self, batch: &RecordBatch) -> Result<()> {
        let key_col = self.column(batch, &self.key)?;
        self.keys = match key_col.data_type() {
            DataType::Int64 | DataType::Int32 => Keys::Int(FxHashMap::default(), Vec::new()),
            DataType::Utf8 => Keys::Str(FxHashMap::default(), Vec::new()),
            other => {
                return Err(Error::Task(format!(
                    "aggregate key column {:?} has type {other}; use int64, int32 or utf8",
                    self.key
                )))
            }
        };
        let mut accs = Vec::with_capacity(self.specs.len());
        for spec in &self.specs {
            check_func(spec)?;
            let name = self.input_name(spec);
            // A count reads only validity: any column type will do.
            let float = spec.func != AggFunc::Count
                && matches!(values(self.column(batch, name)?, name)?, Values::F64(..));
            accs.push(Acc::new(spec.func, float));
        }
        self.accs = accs;
        // Captures taken before now held placeholder (int64) key and value
        // columns; a diff of the real types on top of one would not merge.
        self.force_full = true;
        Ok(())
    }

    /// The column a spec reads; count(*) counts the key column, which has
    /// no nulls.
    fn input_name<'a>(&'a self, spec: &'a AggSpec) -> &'a str {
        spec.column.as_deref().unwrap_or(&self.key)
    }

    fn column<'a>(&self, batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
        batch.column_by_name(name).ok_or_else(|| {
            let names: Vec<_> = batch
                .schema_ref()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
            Error::Task(format!(
                "aggregate column {name:?} is not in the batch (columns: {})",
                names.join(", ")
            ))
        })
    }

    /// Slot of every row's key, adding new keys.
    fn assign_slots(&mut self, key_col: &ArrayRef) -> Result<()> {
        if key_col.null_count() > 0 {
            return Err(Error::Task(format!(
                "aggregate key column {:?} has nulls; filter them out first",
                self.key
            )));
        }
        self.slots.clear();
        let before = self.len();
        match (&mut self.keys, key_col.data_type()) {
            (Keys::Int(map, keys), DataType::Int64) => {
                for &k in key_col.as_primitive::<Int64Type>().values() {
                    let slot = *map.entry(k).or_insert_with(|| {
                        keys.push(k);
                        (keys.len() - 1) as u32
                    });
                    self.slots.push(slot);
                }
            }
            (Keys::Int(map, keys), DataType::Int32) => {
                for &k in key_col.as_primitive::<Int32Type>().values() {
                    let k = k as i64;
                    let slot = *map.entry(k).or_insert_with(|| {
                        keys.push(k);
                        (keys.len() - 1) as u32
                    });
                    self.slots.push(slot);
                }
            }
            (Keys::Str(map, keys), DataType::Utf8) => {
                for k in key_col.as_string::<i32>().iter().flatten() {
                    let slot = match map.get(k) {
                        Some(&s) => s,
                        None => {
                            keys.push(k.to_string());
                            map.insert(k.to_string(), (keys.len() - 1) as u32);
                            (keys.len() - 1) as u32
                        }
                    };
                    self.slots.push(slot);
                }
            }
            (_, other) => {
                return Err(Error::Task(format!(
                    "aggregate key column {:?} changed type to {other} between batches",
                    self.key
                )))
            }
        }
        let after = self.len();
        if after > before {
            for acc in &mut self.accs {
                acc.grow(after);
            }
        }
        Ok(())
    }

    fn key_array(&self) -> (Field, ArrayRef) {
        self.key_array_of(None)
    }

    fn key_array_of(&self, slots: Option<&[u32]>) -> (Field, ArrayRef) {
        match &self.keys {
            Keys::Str(_, k) => (
                Field::new(&self.key, DataType::Utf8, false),
                Arc::new(StringArray::from_iter_values(pick(k, slots))),
            ),
            Keys::Int(_, k) => (
                Field::new(&self.key, DataType::Int64, false),
                Arc::new(Int64Array::from(pick(k, slots))),
            ),
            Keys::Unknown => (
                Field::new(&self.key, DataType::Int64, false),
                Arc::new(Int64Array::from(Vec::<i64>::new())),
            ),
        }
    }

    /// Final results: key plus one column per aggregate.
    fn results(&self) -> Result<RecordBatch> {
        let (kf, ka) = self.key_array();
        let mut fields = vec![kf];
        let mut cols = vec![ka];
        for (spec, acc) in self.specs.iter().zip(&self.accs) {
            let (dt, col): (DataType, ArrayRef) = match acc {
                Acc::Count(v) | Acc::SumI(v) => {
                    (DataType::Int64, Arc::new(Int64Array::from(v.clone())))
                }
                Acc::SumF(v) => (DataType::Float64, Arc::new(Float64Array::from(v.clone()))),
                Acc::MinI(v) | Acc::MaxI(v) => {
                    (DataType::Int64, Arc::new(Int64Array::from(v.clone())))
                }
                Acc::MinF(v) | Acc::MaxF(v) => {
                    (DataType::Float64, Arc::new(Float64Array::from(v.clone())))
                }
                Acc::Mean(s, c) => (
                    DataType::Float64,
                    Arc::new(
                        s.iter()
                            .zip(c)
                            .map(|(&s, &c)| (c > 0).then(|| s / c as f64))
                            .collect::<Float64Array>(),
                    ),
                ),
            };
            fields.push(Field::new(&spec.output, dt, true));
            cols.push(col);
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)
            .map_err(|e| Error::Task(format!("aggregate results: {e}")))
    }

    /// State: key plus accumulators (a mean is `<out>__sum`, `<out>__count`).
    fn state(&self, slots: Option<&[u32]>) -> Result<RecordBatch> {
        let (kf, ka) = self.key_array_of(slots);
        let mut fields = vec![kf];
        let mut cols = vec![ka];
        // Before the first batch the value types are unknown: empty int columns.
        let empty: Vec<Acc> = self.specs.iter().map(|s| Acc::new(s.func, false)).collect();
        let accs = if self.accs.len() == self.specs.len() {
            &self.accs
        } else {
            &empty
        };
        for (spec, acc) in self.specs.iter().zip(accs) {
            let mut push = |name: String, dt: DataType, col: ArrayRef| {
                fields.push(Field::new(name, dt, true));
                cols.push(col);
            };
            let o = spec.output.clone();
            match acc {
                Acc::Count(v) | Acc::SumI(v) => push(
                    o,
                    DataType::Int64,
                    Arc::new(Int64Array::from(pick(v, slots))),
                ),
                Acc::SumF(v) => push(
                    o,
                    DataType::Float64,
                    Arc::new(Float64Array::from(pick(v, slots))),
                ),
                Acc::MinI(v) | Acc::MaxI(v) => push(
                    o,
                    DataType::Int64,
                    Arc::new(Int64Array::from(pick(v, slots))),
                ),
                Acc::MinF(v) | Acc::MaxF(v) => push(
                    o,
                    DataType::Float64,
                    Arc::new(Float64Array::from(pick(v, slots))),
                ),
                Acc::Mean(s, c) => {
                    push(
                        format!("{o}__sum"),
                        DataType::Float64,
                        Arc::new(Float64Array::from(pick(s, slots))),
                    );
                    push(
                        format!("{o}__count"),
                        DataType::Int64,
                        Arc::new(Int64Array::from(pick(c, slots))),
                    );
                }
            }
        }
        if slots.is_some() {
            let n = ka_len(&cols);
            fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
            cols.push(Arc::new(arrow_array::BooleanArray::from(vec![false; n])));
        }
        // The key is named in the schema so that a store can rebuild the
        // full state from a full capture and its diffs without this operator.
        let mut metadata: std::collections::HashMap<String, String> =
            [(KEY_METADATA.to_string(), self.key.clone())].into();
        if slots.is_some() {
            // A diff: the keys the state holds, for a restore that keeps it
            // as a run without counting them (`StateTable`'s diffs do too).
            metadata.insert(LIVE_KEYS_METADATA.to_string(), self.len().to_string());
        }
        RecordBatch::try_new(Arc::new(Schema::new_with_metadata(fields, metadata)), cols)
            .map_err(|e| Error::Task(format!("aggregate state: {e}")))
    }

    fn restore_full(&mut self, batch: &RecordBatch) -> Result<()> {
        let bad = |what: String| Error::Snapshot(format!("aggregate state: {what}"));
        if batch.num_rows() == 0 {
            // Captured before the first batch: its column types are
            // placeholders, so the first batch after restore fixes them.
            self.keys = Keys::Unknown;
            self.accs = Vec::new();
            return Ok(());
        }
        let key_col = batch
            .column_by_name(&self.key)
            .ok_or_else(|| bad(format!("no key column {:?}", self.key)))?;
        self.keys = match key_col.data_type() {
            DataType::Int64 => {
                let k = key_col.as_primitive::<Int64Type>().values().to_vec();
                let map = k.iter().enumerate().map(|(i, &k)| (k, i as u32)).collect();
                Keys::Int(map, k)
            }
            DataType::Utf8 => {
                let k: Vec<String> = key_col
                    .as_string::<i32>()
                    .iter()
                    .map(|s| s.unwrap_or_default().to_string())
                    .collect();
                let map = k
                    .iter()
                    .enumerate()
                    .map(|(i, k)| (k.clone(), i as u32))
                    .collect();
                Keys::Str(map, k)
            }
            other => return Err(bad(format!("key column has type {other}"))),
        };
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| bad(format!("no column {name:?}")))
        };
        let ints = |a: &ArrayRef| -> Result<Vec<Option<i64>>> {
            Ok(a.as_primitive_opt::<Int64Type>()
                .ok_or_else(|| bad("expected int64".into()))?
                .iter()
                .collect())
        };
        let floats = |a: &ArrayRef| -> Result<Vec<Option<f64>>> {
            // The spilling operator keeps an integer column's mean sum as int64.
            let a = &arrow_cast::cast(a, &DataType::Float64).map_err(|e| bad(e.to_string()))?;
            Ok(a.as_primitive_opt::<Float64Type>()
                .ok_or_else(|| bad("expected float64".into()))?
                .iter()
                .collect())
        };
        let mut accs = Vec::with_capacity(self.specs.len());
        for spec in &self.specs {
            check_func(spec)?;
            let o = &spec.output;
            let acc = match spec.func {
                AggFunc::Mean => Acc::Mean(
                    floats(col(&format!("{o}__sum"))?)?
                        .into_iter()
                        .map(|v| v.unwrap_or(0.0))
                        .collect(),
                    ints(col(&format!("{o}__count"))?)?
                        .into_iter()
                        .map(|v| v.unwrap_or(0))
                        .collect(),
                ),
                func => {
                    let c = col(o)?;
                    let float = c.data_type() == &DataType::Float64;
                    match (func, float) {
                        (AggFunc::Count, _) => {
                            Acc::Count(ints(c)?.into_iter().map(|v| v.unwrap_or(0)).collect())
                        }
                        (AggFunc::Sum, false) => {
                            Acc::SumI(ints(c)?.into_iter().map(|v| v.unwrap_or(0)).collect())
                        }
                        (AggFunc::Sum, true) => {
                            Acc::SumF(floats(c)?.into_iter().map(|v| v.unwrap_or(0.0)).collect())
                        }
                        (AggFunc::Min, false) => Acc::MinI(ints(c)?),
                        (AggFunc::Max, false) => Acc::MaxI(ints(c)?),
                        (AggFunc::Min, true) => Acc::MinF(floats(c)?),
                        (AggFunc::Max, true) => Acc::MaxF(floats(c)?),
                        (AggFunc::Mean | AggFunc::First | AggFunc::Last, _) => {
                            unreachable!("handled above")
                        }
                    }
                }
            };
            accs.push(acc);
        }
        self.accs = accs;
        Ok(())
    }
}

impl Operator for KeyedAggregate {
    fn process(&mut self, _input: InputId, batch: Batch, out: &mut dyn Emitter) -> Result<()> {
        if let Some(s) = self.spilling.as_mut() {
            return s.process(_input, batch, out);
        }
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if matches!(self.keys, Keys::Unknown) {
            self.init(&batch)?;
        }
        let key_col = self.column(&batch, &self.key)?.clone();
        self.assign_slots(&key_col)?;
        for k in 0..self.specs.len() {
            let name = self.input_name(&self.specs[k]).to_string();
            let name = name.as_str();
            let col = self.column(&batch, name)?;
            if let Acc::Count(counts) = &mut self.accs[k] {
                match col.logical_nulls() {
                    None => self.slots.iter().for_each(|&s| counts[s as usize] += 1),
                    Some(nulls) => nulls
                        .valid_indices()
                        .for_each(|i| counts[self.slots[i] as usize] += 1),
                }
                continue;
            }
            let vals = values(col, name)?;
            update(&mut self.accs[k], &self.slots, &vals);
        }
        self.mark_dirty();
        if self.forward {
            out.emit(batch)?;
        }
        Ok(())
    }

    fn snapshot(&mut self, id: CheckpointId) -> Result<Option<StateCapture>> {
        if let Some(s) = self.spilling.as_mut() {
            return s.snapshot(id);
        }
        let last = self.unconfirmed.keys().next_back().copied();
        if let Some(last) = last.max(self.confirmed.as_ref().map(|c| c.0)) {
            if id <= last {
                return Err(Error::Task(format!(
                    "aggregate checkpoint ids must increase: got {id} after {last}"
                )));
            }
        }
        let base = match &self.confirmed {
            Some((base, chain)) if !self.force_full && chain.diffs + 1 < self.full_every => {
                Some((*base, *chain))
            }
            _ => None,
        };
        let live = self.len();
        let changed = base.and_then(|(base, chain)| {
            // Most keys changed (the diff would be most of the table) or
            // the chain would outgrow the table: store the table instead.
            // At most twice the cost, and it ends the chain.
            self.changed_unless_most_keys()
                .filter(|c| !full_beats_chain(chain.rows, c.len(), live))
                .map(|c| (base, chain, c))
        });
        let (capture, chain) = match changed {
            None => (
                StateCapture {
                    kind: StateKind::Full,
                    batch: self.state(None)?,
                    filter: None,
                    times: None,
                },
                Chain::default(),
            ),
            Some((base, chain, changed)) => (
                StateCapture {
                    kind: StateKind::Diff { base },
                    batch: self.state(Some(&changed))?,
                    filter: None,
                    times: None,
                },
                Chain {
                    diffs: chain.diffs + 1,
                    rows: chain.rows + changed.len(),
                },
            ),
        };
        let slots = self.dirty.take(self.len());
        self.unconfirmed.insert(id, Epoch { slots, chain });
        self.force_full &= chain.diffs > 0;
        Ok(Some(capture))
    }

    fn commit(&mut self, id: CheckpointId) -> Result<()> {
        if let Some(s) = self.spilling.as_mut() {
            return s.commit(id);
        }
        // Completions arrive in id order; one for a capture already folded
        // into a newer confirmed one (or never taken) changes nothing.
        if let Some(epoch) = self.unconfirmed.remove(&id) {
            self.unconfirmed = self.unconfirmed.split_off(&id);
            self.confirmed = Some((id, epoch.chain));
        }
        Ok(())
    }

    fn abort(&mut self, id: CheckpointId) -> Result<()> {
        if let Some(s) = self.spilling.as_mut() {
            return s.abort(id);
        }
        // Its capture was never stored, so it can never be a base; its
        // changes still count as unconfirmed, now in the open interval.
        if let Some(epoch) = self.unconfirmed.remove(&id) {
            let capacity = self.len();
            match &epoch.slots {
                Some(slots) => self.dirty.mark(slots, capacity),
                // An epoch of every slot: every slot counts as changed, not
                // only for the next capture (full anyway) but for each diff
                // on a base confirmed before it, which may still be taken
                // while that full capture is not confirmed (its changes
                // would be missing from them otherwise).
                None => self.dirty.mark_all(capacity),
            }
            // Diffs in flight stay valid (their base is confirmed). The next
            // capture is still full, as a safety net: the abort may have been
            // a sink refusing a diff whose confirmed base it no longer holds
            // (`SnapshotStore` rebases those, a custom sink may not), and more
            // diffs on that base would fail the same way.
            self.force_full = true;
        }
        Ok(())
    }

    fn set_full_every(&mut self, full_every: u32) {
        if let Some(s) = self.spilling.as_mut() {
            s.set_full_every(full_every);
        }
        // With 1, `mark_dirty` tracked nothing: no diff may rest on that.
        self.force_full |= self.full_every == 1 && full_every > 1;
        self.full_every = full_every.max(1);
    }

    fn set_state_memory(&mut self, memory: &StateMemory) -> Result<()> {
        if self.len() > 0 {
            return Err(Error::Config(
                "a keyed aggregate's memory budget is set before its first batch".into(),
            ));
        }
        std::fs::create_dir_all(&memory.spill_dir).map_err(|e| {
            Error::io(
                format!(
                    "creating the state spill directory {}",
                    memory.spill_dir.display()
                ),
                e,
            )
        })?;
        self.spilling = Some(Box::new(SpillingAggregate::new(
            self.key.clone(),
            self.specs.clone(),
            self.forward,
            self.full_every,
            memory.clone(),
        )));
        Ok(())
    }

    fn spill_stats(&self) -> Option<SpillStats> {
        self.spilling.as_ref().and_then(|s| s.spill_stats())
    }

    fn restores_runs(&self) -> bool {
        self.spilling.is_some()
    }

    fn restore_runs(&mut self, runs: &[(CheckpointId, StateCapture)]) -> Result<()> {
        match self.spilling.as_mut() {
            Some(s) => s.restore_runs(runs),
            None => Err(Error::Snapshot(
                "an in-memory keyed aggregate restores from one full capture, not runs".into(),
            )),
        }
    }

    fn restore(&mut self, chain: &[StateCapture]) -> Result<()> {
        if let Some(s) = self.spilling.as_mut() {
            return s.restore(chain);
        }
        let Some(full) = one_full_capture(chain)? else {
            return Ok(());
        };
        self.restore_full(&full.batch)?;
        self.dirty.reset(self.len());
        // The restored checkpoint's id is not known here: the next
        // capture is full.
        self.unconfirmed.clear();
        self.confirmed = None;
        self.force_full = false;
        Ok(())
    }

    fn finish(&mut self, out: &mut dyn Emitter) -> Result<()> {
        if let Some(s) = self.spilling.as_mut() {
            return s.finish(out);
        }
        if self.len() > 0 && !self.forward {
            out.emit(self.results()?)?;
        }
        Ok(())
    }
}

/// The one full capture a keyed aggregate restores from (`None`: no state),
/// or why a chain is not that.
pub(super) fn one_full_capture(chain: &[StateCapture]) -> Result<Option<&StateCapture>> {
    match chain {
        [] => Ok(None),
        [full] if full.kind == StateKind::Full => Ok(Some(full)),
        _ => Err(Error::Snapshot(
            "keyed aggregates restore from one full state capture (a store rebuilds it \
             from its diff chain); got a chain of several or a lone diff"
                .into(),
        )),
    }
}

/// This operator implements count, sum, min, max and mean only; first and
/// last exist in `state::KeyedAggregates`, so say where to find them.
fn check_func(spec: &AggSpec) -> Result<()> {
    match spec.func {
        AggFunc::First | AggFunc::Last => Err(Error::Config(format!(
            "aggregate {spec}: the keyed_aggregate operator supports count, sum, min, max and \
             mean; use state::KeyedAggregates for first/last"
        ))),
        _ => Ok(()),
    }
}

/// Keyed aggregates grouped by `key` (int64, int32 or utf8): one output row
/// per key at end of input, columns `key, <spec.output>...`.
pub fn keyed_aggregate(
    key: impl Into<String>,
    specs: Vec<AggSpec>,
) -> Result<Arc<dyn OperatorFactory>> {
    aggregate_factory(key.into(), specs, false)
}

/// A streaming stateful stage: the same keyed aggregates (state,
/// checkpoints, restore), but every input batch is passed on unchanged
/// after it is folded in, and nothing is emitted at end of input. Chains of
/// these with hash shuffles between them make the ABS paper's topology
/// (keyed state at every stage, every record through every stage).
pub fn keyed_aggregate_forwarding(
    key: impl Into<String>,
    specs: Vec<AggSpec>,
) -> Result<Arc<dyn OperatorFactory>> {
    aggregate_factory(key.into(), specs, true)
}

fn aggregate_factory(
    key: String,
    specs: Vec<AggSpec>,
    forward: bool,
) -> Result<Arc<dyn OperatorFactory>> {
    if specs.is_empty() {
        return Err(Error::Config(
            "keyed_aggregate needs at least one aggregate".into(),
        ));
    }
    let mut outs = std::collections::HashSet::new();
    for s in &specs {
        check_func(s)?;
        if s.output == key || !outs.insert(s.output.clone()) {
            return Err(Error::Config(format!(
                "aggregate output name {:?} is used twice (or equals the key); give each a distinct name",
                s.output
            )));
        }
    }
    Ok(Arc::new(
        move |_: usize, _: usize| -> Result<Box<dyn Operator>> {
            let op = KeyedAggregate::new(key.clone(), specs.clone());
            Ok(Box::new(if forward { op.forwarding() } else { op }))
        },
    ))
}
