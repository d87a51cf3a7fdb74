//! [`RunSet`]: a state's sorted runs, newest first, and batched lookups in
//! them. A key's value is in the newest run that holds the key: a live row
//! there is the value, a tombstone there means deleted, whatever older runs
//! hold. A batch of probes goes through the runs together, each run seeing
//! only the probes no newer run has answered, and of those only the ones in
//! its key range and its filter; the rest are found by one batched search of
//! its key column ([`super::sorted::find`]).

use std::ops::{AddAssign, Range};
use std::sync::Arc;

use arrow_array::{
    make_array, new_null_array, Array, ArrayRef, BooleanArray, RecordBatch, UInt32Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use arrow_select::interleave::interleave;

use super::keys::{prefix_range, KeyColumn, KeyRef};
use super::run::{check_columns, Run};
use super::sorted::hashes;
use crate::error::{Error, Result};
use crate::state::key::KeyType;
use crate::state::table::{column_names, DELETED_COLUMN, KEY_METADATA};

/// A state's runs, newest first, all with the table's columns.
#[derive(Clone, Debug)]
pub struct RunSet {
    /// The lookup schema: the table's, every non-key column nullable.
    schema: SchemaRef,
    key_col: usize,
    key_type: KeyType,
    runs: Vec<Arc<Run>>,
}

/// What one batched lookup cost, for metrics. A (probe, run) pair is counted
/// once, by the first check that settled it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LookupStats {
    pub probes: usize,
    /// Runs whose key column was searched (some probe passed range and filter).
    pub runs_searched: usize,
    /// Pairs skipped because the probe is outside the run's key range.
    pub range_pruned: usize,
    /// Pairs skipped because the run's filter does not hold the probe.
    pub filter_pruned: usize,
    /// Pairs the filter let through that the run does not hold.
    pub filter_false_positives: usize,
    /// Probes answered by a live row.
    pub found: usize,
    /// Probes answered by a tombstone.
    pub deleted: usize,
}

impl AddAssign for LookupStats {
    fn add_assign(&mut self, other: Self) {
        self.probes += other.probes;
        self.runs_searched += other.runs_searched;
        self.range_pruned += other.range_pruned;
        self.filter_pruned += other.filter_pruned;
        self.filter_false_positives += other.filter_false_positives;
        self.found += other.found;
        self.deleted += other.deleted;
    }
}

/// The answer to [`RunSet::lookup`]; it borrows the set, so the set cannot
/// change before the rows are gathered with [`Self::to_batch`].
#[derive(Debug)]
pub struct Lookup<'a> {
    set: &'a RunSet,
    probes: &'a dyn Array,
    hits: Vec<Option<(usize, u32)>>,
    stats: LookupStats,
}

impl<'a> Lookup<'a> {
    /// Per probe, in the order asked: the run (index in the set, newest 0)
    /// and row of its live value, or `None` if absent or deleted.
    pub fn hits(&self) -> &[Option<(usize, u32)>] {
        &self.hits
    }

    pub fn stats(&self) -> LookupStats {
        self.stats
    }

    /// Which probes were found (live).
    pub fn found(&self) -> BooleanArray {
        self.hits.iter().map(|h| Some(h.is_some())).collect()
    }

    /// As `StateTable::lookup`: one row per probe, in the order asked, with
    /// the set's [`RunSet::lookup_schema`]: the key column is the probes, the
    /// other columns the found row's values or nulls; and the found mask.
    pub fn to_batch(&self) -> Result<(RecordBatch, BooleanArray)> {
        let set = self.set;
        let n = self.hits.len();
        // The absent probes' source: one null row after the runs.
        let nulls = set.runs.len();
        let picks: Vec<(usize, usize)> = self
            .hits
            .iter()
            .map(|h| h.map_or((nulls, 0), |(run, row)| (run, row as usize)))
            .collect();
        let any = self.hits.iter().any(Option::is_some);
        let mut arrays = Vec::with_capacity(set.schema.fields().len());
        for (col, field) in set.schema.fields().iter().enumerate() {
            let array = if col == set.key_col {
                make_array(self.probes.to_data())
            } else if !any {
                new_null_array(field.data_type(), n)
            } else {
                let null = new_null_array(field.data_type(), 1);
                let mut sources: Vec<&dyn Array> = set
                    .runs
                    .iter()
                    .map(|r| r.batch().column(col).as_ref())
                    .collect();
                sources.push(null.as_ref());
                interleave(&sources, &picks).map_err(|e| {
                    Error::Snapshot(format!("gathering column '{}': {e}", field.name()))
                })?
            };
            arrays.push(array);
        }
        let batch = RecordBatch::try_new(set.schema.clone(), arrays)
            .expect("the runs' columns have the lookup schema's types");
        Ok((batch, self.found()))
    }
}

/// The state of one batched lookup as it goes from run to run.
struct Search<'p> {
    probes: &'p dyn Array,
    keys: KeyColumn<'p>,
    hashes: Vec<u64>,
    /// Probes no run has answered yet, in probe order.
    open: Vec<u32>,
    answered: Vec<bool>,
    hits: Vec<Option<(usize, u32)>>,
    stats: LookupStats,
}

impl<'p> Search<'p> {
    fn new(probes: &'p dyn Array) -> Result<Self> {
        let n = probes.len();
        Ok(Self {
            keys: KeyColumn::new(probes)?,
            hashes: hashes(probes)?,
            open: (0..n as u32).collect(),
            answered: vec![false; n],
            hits: vec![None; n],
            stats: LookupStats {
                probes: n,
                ..LookupStats::default()
            },
            probes,
        })
    }

    /// Answers the open probes that run `at` holds.
    fn run(&mut self, at: usize, run: &Run) -> Result<()> {
        let asked = self.survivors(run);
        if asked.is_empty() {
            return Ok(());
        }
        self.stats.runs_searched += 1;
        let asked = UInt32Array::from(asked);
        let rows = if asked.len() == self.probes.len() {
            // Every probe is asked: no need to copy them.
            run.find(self.probes)?
        } else {
            let taken = arrow_select::take::take(self.probes, &asked, None)
                .map_err(|e| Error::Config(format!("selecting probes: {e}")))?;
            run.find(taken.as_ref())?
        };
        for (&p, row) in asked.values().iter().zip(rows) {
            let Some(row) = row else {
                self.stats.filter_false_positives += 1;
                continue;
            };
            self.answered[p as usize] = true;
            if run.is_deleted(row as usize) {
                self.stats.deleted += 1;
            } else {
                self.hits[p as usize] = Some((at, row));
                self.stats.found += 1;
            }
        }
        self.open.retain(|&p| !self.answered[p as usize]);
        Ok(())
    }

    /// The open probes that pass `run`'s key range, then its filter.
    fn survivors(&mut self, run: &Run) -> Vec<u32> {
        let Some(range) = run.key_range() else {
            // An empty run holds nothing: every probe is outside its range.
            self.stats.range_pruned += self.open.len();
            return Vec::new();
        };
        let mut asked = Vec::with_capacity(self.open.len());
        for &p in &self.open {
            if !range.contains(self.keys.at(p as usize)) {
                self.stats.range_pruned += 1;
            } else if !run.filter_may_contain(self.hashes[p as usize]) {
                self.stats.filter_pruned += 1;
            } else {
                asked.push(p);
            }
        }
        asked
    }
}

impl RunSet {
    /// An empty set for a table of `schema` (`StateTable::schema` or
    /// `lookup_schema`) keyed by column `key`.
    pub fn new(schema: &Schema, key: &str) -> Result<Self> {
        let key_col = schema.index_of(key).map_err(|_| {
            Error::Config(format!(
                "key column '{key}' is not in the state schema (columns: {})",
                column_names(schema)
            ))
        })?;
        if schema.fields().iter().any(|f| f.name() == DELETED_COLUMN) {
            return Err(Error::Config(format!(
                "a run set's schema is the table's, without '{DELETED_COLUMN}' (runs add it)"
            )));
        }
        let key_type = KeyType::new(key, schema.field(key_col).data_type())?;
        // As StateTable::lookup_schema: an absent key's row is nulls but its key.
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| f.as_ref().clone().with_nullable(i != key_col))
            .collect();
        let mut metadata = schema.metadata().clone();
        metadata.insert(KEY_METADATA.into(), key.into());
        Ok(Self {
            schema: Arc::new(Schema::new_with_metadata(fields, metadata)),
            key_col,
            key_type,
            runs: Vec::new(),
        })
    }

    /// The schema of [`Lookup::to_batch`]'s rows.
    pub fn lookup_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    pub fn key_column(&self) -> &str {
        self.schema.field(self.key_col).name()
    }

    pub fn len(&self) -> usize {
        self.runs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The runs, newest first.
    pub fn runs(&self) -> &[Arc<Run>] {
        &self.runs
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Arc<Run>> {
        self.runs.iter()
    }

    /// Memory held by every run ([`Run::size_bytes`]).
    pub fn size_bytes(&self) -> usize {
        self.runs.iter().map(|r| r.size_bytes()).sum()
    }

    fn check(&self, run: &Run, oldest: bool, what: &str) -> Result<()> {
        check_columns(run, self.schema.fields(), self.key_col, what)?;
        if run.is_base() && !oldest {
            return Err(Error::Config(format!(
                "{what}: a base run (no '{DELETED_COLUMN}' column) is the whole state, so only \
                 the oldest run of a set; start a new set with it, or merge with tombstones kept"
            )));
        }
        Ok(())
    }

    /// Adds `run` as the newest. A base only goes into an empty set.
    pub fn push_newest(&mut self, run: impl Into<Arc<Run>>) -> Result<()> {
        let run = run.into();
        self.check(&run, self.runs.is_empty(), "pushing a run")?;
        self.runs.insert(0, run);
        Ok(())
    }

    /// Puts `merged` (the [`super::merge()`] of the runs `range`, newest
    /// first) in their place; returns the runs it replaces. A base may only
    /// replace a range that ends with the oldest run.
    pub fn replace(
        &mut self,
        range: Range<usize>,
        merged: impl Into<Arc<Run>>,
    ) -> Result<Vec<Arc<Run>>> {
        if range.start >= range.end || range.end > self.runs.len() {
            return Err(Error::Config(format!(
                "cannot replace runs {range:?} of a set of {}: the range must be non-empty \
                 and within the set",
                self.runs.len()
            )));
        }
        let merged = merged.into();
        self.check(&merged, range.end == self.runs.len(), "replacing runs")?;
        Ok(self.runs.splice(range, [merged]).collect())
    }

    /// Where each of `probes` (any order, duplicates allowed, the key's type,
    /// no nulls) lives, newest run first; see [`Lookup`].
    pub fn lookup<'a>(&'a self, probes: &'a dyn Array) -> Result<Lookup<'a>> {
        self.key_type.check(self.key_column(), probes)?;
        let mut search = Search::new(probes)?;
        for (at, run) in self.runs.iter().enumerate() {
            if search.open.is_empty() {
                break;
            }
            search.run(at, run)?;
        }
        Ok(Lookup {
            set: self,
            probes,
            hits: search.hits,
            stats: search.stats,
        })
    }

    /// [`Self::lookup`] then [`Lookup::to_batch`], the probes taken in
    /// `chunks` runs of key order (rows and found flags back in the order
    /// asked), `after_chunk` called after each: a caller that releases the
    /// runs' pages there ([`Run::release_pages`]) holds at most about a
    /// chunk's share of each run's key range resident, where one pass of
    /// many random probes would touch nearly every page of every run.
    pub fn gather_in_key_chunks(
        &self,
        probes: &dyn Array,
        chunks: usize,
        after_chunk: &mut dyn FnMut(),
    ) -> Result<(RecordBatch, BooleanArray, LookupStats)> {
        let n = probes.len();
        let Some((order, size)) = self.key_order(probes, chunks)? else {
            let lookup = self.lookup(probes)?;
            let (batch, found) = lookup.to_batch()?;
            after_chunk();
            return Ok((batch, found, lookup.stats()));
        };
        let mut batches = Vec::with_capacity(chunks);
        let mut found = Vec::with_capacity(n);
        let mut stats = LookupStats::default();
        for rows in order.chunks(size) {
            let part = take_probes(probes, rows)?;
            let lookup = self.lookup(part.as_ref())?;
            let (batch, part_found) = lookup.to_batch()?;
            stats += lookup.stats();
            found.extend(part_found.values().iter());
            batches.push(batch);
            after_chunk();
        }
        let sorted = arrow_select::concat::concat_batches(&self.schema, &batches)
            .map_err(|e| Error::Config(format!("joining a chunked lookup: {e}")))?;
        // Where each probe, in the order asked, landed in key order.
        let mut at = vec![0u32; n];
        for (pos, &row) in order.iter().enumerate() {
            at[row as usize] = pos as u32;
        }
        let batch = arrow_select::take::take_record_batch(&sorted, &UInt32Array::from(at.clone()))
            .map_err(|e| Error::Config(format!("reordering a chunked lookup: {e}")))?;
        let found = at.iter().map(|&pos| Some(found[pos as usize])).collect();
        Ok((batch, found, stats))
    }

    /// [`Self::lookup`]'s stats alone (how many probes the runs hold
    /// live, ...), the probes taken in `chunks` runs of key order with
    /// `after_chunk` called after each, as [`Self::gather_in_key_chunks`]:
    /// a search of many random probes reads nearly every page of every
    /// run's keys, which a caller releasing pages there does not hold at once.
    pub fn stats_in_key_chunks(
        &self,
        probes: &dyn Array,
        chunks: usize,
        after_chunk: &mut dyn FnMut(),
    ) -> Result<LookupStats> {
        let Some((order, size)) = self.key_order(probes, chunks)? else {
            let stats = self.lookup(probes)?.stats();
            after_chunk();
            return Ok(stats);
        };
        let mut stats = LookupStats::default();
        for rows in order.chunks(size) {
            stats += self.lookup(take_probes(probes, rows)?.as_ref())?.stats();
            after_chunk();
        }
        Ok(stats)
    }

    /// The positions of `probes` in key order and the size of each of the
    /// `chunks` they are looked up in, or None if one lookup does (one
    /// chunk, or fewer than two probes).
    fn key_order(&self, probes: &dyn Array, chunks: usize) -> Result<Option<(Vec<u32>, usize)>> {
        if chunks <= 1 || probes.len() < 2 {
            return Ok(None);
        }
        self.key_type.check(self.key_column(), probes)?;
        let (order, _) = KeyColumn::new(probes)?.order();
        Ok(Some((order, probes.len().div_ceil(chunks))))
    }

    /// The newest live row of every key that begins with one of `prefixes`
    /// (a binary array; binary keys): per row, (prefix's index, run, row),
    /// prefixes in the order given, a prefix's keys in key order. A newer
    /// run's row or tombstone of a key hides the older runs' rows of it.
    /// Each run costs two binary searches a prefix (its keys are sorted).
    pub fn scan_prefixes(&self, prefixes: &dyn Array) -> Result<Vec<(u32, usize, u32)>> {
        let key_type = self.schema.field(self.key_col).data_type();
        if !matches!(key_type, DataType::Binary | DataType::LargeBinary)
            || !matches!(
                prefixes.data_type(),
                DataType::Binary | DataType::LargeBinary
            )
        {
            return Err(Error::Config(format!(
                "scanning runs by prefix needs binary keys and prefixes; the key column '{}' \
                 is {key_type}, the prefixes {}",
                self.key_column(),
                prefixes.data_type()
            )));
        }
        let wanted = KeyColumn::new(prefixes)?;
        let columns: Vec<KeyColumn<'_>> = self
            .runs
            .iter()
            .map(|r| KeyColumn::new(r.keys().as_ref()))
            .collect::<Result<_>>()?;
        let mut rows = Vec::new();
        let mut found: Vec<(KeyRef<'_>, usize, u32)> = Vec::new();
        for p in 0..wanted.len() {
            let KeyRef::Bytes(prefix) = wanted.at(p) else {
                unreachable!("binary prefixes read as bytes");
            };
            found.clear();
            for (run, keys) in columns.iter().enumerate() {
                found.extend(prefix_range(keys, prefix).map(|row| (keys.at(row), run, row as u32)));
            }
            // A key's newest run (the lowest index) first, then skip its older rows.
            found.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
            let mut last = None;
            for &(key, run, row) in &found {
                if last == Some(key) {
                    continue;
                }
                last = Some(key);
                if !self.runs[run].is_deleted(row as usize) {
                    rows.push((p as u32, run, row));
                }
            }
        }
        Ok(rows)
    }
}

/// The probes at `rows` (positions in `probes`), for a chunk of a lookup.
fn take_probes(probes: &dyn Array, rows: &[u32]) -> Result<ArrayRef> {
    arrow_select::take::take(probes, &UInt32Array::from(rows.to_vec()), None)
        .map_err(|e| Error::Config(format!("selecting probes: {e}")))
}
