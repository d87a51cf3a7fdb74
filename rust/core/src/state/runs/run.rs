//! [`Run`]: one immutable sorted run. Its batch has the state table's
//! columns, the key column sorted ascending with each key once and no nulls,
//! and, last, a non-null Boolean `__deleted` ([`DELETED_COLUMN`]): `true`
//! marks a tombstone, a key deleted at this level (its other columns are
//! null). A run without the `__deleted` column is a *base*: every row live,
//! and the whole state as of that run, so a base is only ever the oldest run
//! of a set (a full capture as `StateTable::checkpoint` makes it, or a
//! compaction that reached the oldest run and dropped the tombstones).
//! Either layout is a state file as written, so a file becomes a run without
//! being rewritten. Beside the batch a run keeps its key range and a bloom
//! filter of its keys, so lookups skip it for keys it cannot hold.

use std::fmt;
use std::sync::{Arc, OnceLock};

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt32Array};
use arrow_schema::FieldRef;
use arrow_select::take::take_record_batch;

use super::filter::BloomFilter;
use super::keys::{KeyColumn, KeyRange, KeyRef};
use super::sorted::{check_sorted, find, find_fenced, hashes, Fences};
use crate::error::{Error, Result};
use crate::state::key::KeyType;
use crate::state::table::{column_names, DELETED_COLUMN};

/// The filters' false-positive probability unless the store says otherwise:
/// ~9.6 bits per key.
pub const DEFAULT_FPP: f64 = 0.01;

/// Keys of a stored run checked against its stored filter (see [`Run::from_parts`]).
const FILTER_SAMPLE: usize = 64;

/// Memory a run's batch lies in that its holder can hand back while it
/// keeps the run: a mapped file's resident pages (`crate::store::LocalRuns`
/// maps its runs). A pass over a whole run (a merge, its filter built)
/// releases them behind it, so the pages it read do not stay counted in
/// the process's resident set.
pub trait Pages: Send + Sync + fmt::Debug {
    /// Lets the pages go; a later read brings them back.
    fn release(&self);
}

#[derive(Clone)]
pub struct Run {
    batch: RecordBatch,
    /// `Some` when the batch lies in pages its holder can release.
    pages: Option<Arc<dyn Pages>>,
    key_col: usize,
    /// The `__deleted` column; `None` for a base.
    tombstones: Option<BooleanArray>,
    /// `None` for an empty run.
    range: Option<KeyRange>,
    /// `None`: no filter ([`Self::from_sorted_unfiltered`]).
    filter: Option<BloomFilter>,
    /// Made at the first search, not with the run: a mapped base is read
    /// only where lookups go, and a flushed run may be merged unsearched.
    fences: OnceLock<Option<Fences>>,
}

impl fmt::Debug for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run")
            .field("key", &self.key_column())
            .field("len", &self.len())
            .field("base", &self.is_base())
            .field("range", &self.range)
            .field(
                "filter_bytes",
                &self.filter.as_ref().map(BloomFilter::len_bytes),
            )
            .finish()
    }
}

/// Where a checked batch keeps its keys and tombstones.
struct Shape {
    key_col: usize,
    tombstones: Option<BooleanArray>,
}

/// Checks a batch's layout (not its order): the key column, and the
/// tombstone column if there is one. Errors are `Config`; a file's reader
/// turns them into `Snapshot` errors ([`in_file`]).
fn shape(batch: &RecordBatch, key: &str) -> Result<Shape> {
    let schema = batch.schema_ref();
    let key_col = schema.index_of(key).map_err(|_| {
        Error::Config(format!(
            "a run's batch has no key column '{key}' (columns: {})",
            column_names(schema)
        ))
    })?;
    let keys = batch.column(key_col);
    KeyType::new(key, keys.data_type())?.check(key, keys.as_ref())?;
    let tombstones = match schema.index_of(DELETED_COLUMN) {
        Ok(at) => Some(tombstone_column(batch, at)?),
        Err(_) => None,
    };
    Ok(Shape {
        key_col,
        tombstones,
    })
}

fn tombstone_column(batch: &RecordBatch, at: usize) -> Result<BooleanArray> {
    let bad = |why: String| Err(Error::Config(format!("a run's '{DELETED_COLUMN}' {why}")));
    if at + 1 != batch.num_columns() {
        return bad(format!(
            "is column {at} of {}; it must be the last one, as in StateTable::diff_schema",
            batch.num_columns()
        ));
    }
    let column = batch.column(at);
    let Some(tombstones) = column.as_boolean_opt() else {
        return bad(format!(
            "column has type {}; tombstones are a non-null Boolean column",
            column.data_type()
        ));
    };
    if tombstones.null_count() > 0 {
        return bad(format!(
            "column holds {} null(s); each row of a run is live (false) or a tombstone (true)",
            tombstones.null_count()
        ));
    }
    Ok(tombstones.clone())
}

/// A defect of a stored batch is a corrupt or foreign file, named by `what`.
fn in_file(what: &str) -> impl Fn(Error) -> Error + '_ {
    move |e| match e {
        Error::Config(m) => Error::Snapshot(format!("{what}: {m}")),
        e => e,
    }
}

/// The bloom filter of `keys` (any order, each once) at false-positive
/// probability `fpp`: what a run builds for itself, and what a state file's
/// stored filter holds (format 3).
pub fn build_filter(keys: &dyn Array, fpp: f64) -> Result<BloomFilter> {
    let mut filter = BloomFilter::for_keys(keys.len(), fpp)?;
    for hash in hashes(keys)? {
        filter.insert(hash);
    }
    Ok(filter)
}

/// The order that sorts `keys`, or `None` if they are sorted already; a key
/// twice is an error naming it (a run holds each key once).
fn sort_order(keys: &dyn Array, name: &str) -> Result<Option<UInt32Array>> {
    let column = KeyColumn::new(keys)?;
    let at = |i: u32| column.at(i as usize);
    if (1..column.len() as u32).all(|i| at(i - 1) < at(i)) {
        return Ok(None);
    }
    // Ties in row order, so the duplicate's rows are named in batch order.
    let (order, tie) = column.order();
    if let Some(pair) = tie {
        return Err(Error::Config(format!(
            "key column '{name}' holds key {} twice (rows {} and {}); a run holds each key \
             once: merge the changes first, the newest row winning",
            at(pair[0]),
            pair[0],
            pair[1]
        )));
    }
    Ok(Some(UInt32Array::from(order)))
}

/// The order that sorts `batch` by its column `key` as a run, or `None` if
/// it is sorted already; a key twice, or a batch that is not a run's, is an
/// `Error::Config` (as [`Run::from_unsorted`]).
pub fn run_order(batch: &RecordBatch, key: &str) -> Result<Option<UInt32Array>> {
    let shape = shape(batch, key)?;
    sort_order(batch.column(shape.key_col).as_ref(), key)
}

/// `batch` sorted by its column `key` (as it is if it already is); a key
/// twice, or a batch that is not a run's, is an `Error::Config`.
fn sorted_by_key(batch: RecordBatch, key: &str) -> Result<RecordBatch> {
    match run_order(&batch, key)? {
        None => Ok(batch),
        Some(order) => take_record_batch(&batch, &order)
            .map_err(|e| Error::Config(format!("sorting a run's batch by '{key}' failed: {e}"))),
    }
}

impl Run {
    /// A run of a batch read from a file (`what` names it): checked for its
    /// layout and order, every defect an `Error::Snapshot`; the filter is
    /// built at false-positive probability `fpp`.
    pub fn from_sorted(batch: RecordBatch, key: &str, fpp: f64, what: &str) -> Result<Self> {
        let shape = shape(&batch, key).map_err(in_file(what))?;
        let keys = batch.column(shape.key_col).as_ref();
        check_sorted(keys, what)?;
        let filter = build_filter(keys, fpp)?;
        Ok(Self::assemble(batch, shape, Some(filter)))
    }

    /// A run of a batch made in memory, in any row order: a diff batch as
    /// `StateTable::checkpoint` or `changes` makes it (upserts then
    /// tombstones), or a full one (no `__deleted`: a base). Sorted here; a
    /// key twice, like any other defect, is an `Error::Config`.
    pub fn from_unsorted(batch: RecordBatch, key: &str, fpp: f64) -> Result<Self> {
        Self::from_sorted_trusted(sorted_by_key(batch, key)?, key, fpp)
    }

    /// As [`Self::from_unsorted`], with no filter: a run that is only read
    /// in order, never probed (a compaction's input).
    pub fn from_unsorted_unfiltered(batch: RecordBatch, key: &str) -> Result<Self> {
        Self::from_sorted_trusted_unfiltered(sorted_by_key(batch, key)?, key)
    }

    /// A run of a sorted batch with no filter: every probe in its key range
    /// is searched. For a base adopted from a state file as it is
    /// (`StateTable::restore_mapped`): a base holds nearly every key a batch
    /// looks up, so a filter would let almost all of them through, and
    /// building one (a hash and a cache miss per key, ~1 s per 10M keys)
    /// would be most of a cold restore. Errors as [`Self::from_sorted`].
    pub fn from_sorted_unfiltered(batch: RecordBatch, key: &str, what: &str) -> Result<Self> {
        let shape = shape(&batch, key).map_err(in_file(what))?;
        check_sorted(batch.column(shape.key_col).as_ref(), what)?;
        Ok(Self::assemble(batch, shape, None))
    }

    /// A run rebuilt from a file and its stored filter ([`Self::filter_bytes`]),
    /// `what` naming the file. The batch is checked as by
    /// [`Self::from_sorted`]; the filter as by [`Self::with_filter`].
    pub fn from_parts(batch: RecordBatch, key: &str, filter: &[u8], what: &str) -> Result<Self> {
        let filter = BloomFilter::from_bytes(filter, what)?;
        Self::from_sorted_unfiltered(batch, key, what)?.with_filter(filter, what)
    }

    /// The run with `filter` (read from a file beside the run's, `what`
    /// naming the run) as its filter. The filter must hold a sample of the
    /// run's keys (up to 64, evenly spaced, first and last included), which
    /// catches a filter stored beside the wrong file without hashing them
    /// all; a filter that lacks one is an `Error::Snapshot`.
    pub fn with_filter(self, filter: BloomFilter, what: &str) -> Result<Self> {
        let column = KeyColumn::new(self.keys().as_ref())?;
        let n = column.len();
        let step = n.div_ceil(FILTER_SAMPLE).max(1);
        for row in (0..n).step_by(step).chain(n.checked_sub(1)) {
            let key = column.at(row);
            if !filter.may_contain(key.hash()) {
                return Err(Error::Snapshot(format!(
                    "{what}: its bloom filter lacks key {key} (row {row}) that the run holds: \
                     the filter is corrupt or another run's"
                )));
            }
        }
        Ok(Self {
            filter: Some(filter),
            ..self
        })
    }

    /// A batch sorted by construction (a merge's output, a sorted diff):
    /// the layout is checked, the order only in debug builds.
    pub(crate) fn from_sorted_trusted(batch: RecordBatch, key: &str, fpp: f64) -> Result<Self> {
        let shape = shape(&batch, key)?;
        let keys = batch.column(shape.key_col).as_ref();
        debug_assert!(
            check_sorted(keys, "run").is_ok(),
            "a trusted run is unsorted"
        );
        let filter = build_filter(keys, fpp)?;
        Ok(Self::assemble(batch, shape, Some(filter)))
    }

    /// A batch sorted by construction that is read in order, never probed
    /// (a time index's merged run): no filter, so making it reads none of
    /// its keys (a mapped file's pages stay on disk); the order is checked
    /// only in debug builds.
    pub(crate) fn from_sorted_trusted_unfiltered(batch: RecordBatch, key: &str) -> Result<Self> {
        let shape = shape(&batch, key)?;
        debug_assert!(
            check_sorted(batch.column(shape.key_col).as_ref(), "run").is_ok(),
            "a trusted run is unsorted"
        );
        Ok(Self::assemble(batch, shape, None))
    }

    fn assemble(batch: RecordBatch, shape: Shape, filter: Option<BloomFilter>) -> Self {
        let keys = KeyColumn::new(batch.column(shape.key_col).as_ref()).expect("a checked key");
        let range = KeyRange::of_sorted(&keys);
        Self {
            key_col: shape.key_col,
            tombstones: shape.tombstones,
            range,
            filter,
            fences: OnceLock::new(),
            batch,
            pages: None,
        }
    }

    /// The run, its batch lying in `pages` (see [`Pages`]).
    pub fn with_pages(self, pages: Arc<dyn Pages>) -> Self {
        Self {
            pages: Some(pages),
            ..self
        }
    }

    /// The run of rows `start..` of this one (a slice of its batch, in the
    /// same pages), unfiltered: for a merge of what is left of a run.
    pub fn tail(&self, start: usize, what: &str) -> Result<Self> {
        let batch = self.batch.slice(start, self.len() - start);
        let run = Self::from_sorted_unfiltered(batch, self.key_column(), what)?;
        Ok(match &self.pages {
            Some(pages) => run.with_pages(Arc::clone(pages)),
            None => run,
        })
    }

    /// Whether the run's batch lies in pages its holder can release.
    pub fn has_pages(&self) -> bool {
        self.pages.is_some()
    }

    /// Releases the pages the run's batch lies in, if it knows them
    /// ([`Pages::release`]); the run reads as before.
    pub fn release_pages(&self) {
        if let Some(pages) = &self.pages {
            pages.release();
        }
    }

    /// Where each of `probes` (the key's type, any order) is in this run:
    /// its row, or `None` ([`super::sorted::find`], through the run's
    /// [`Fences`] once it is long enough to have them).
    pub(crate) fn find(&self, probes: &dyn Array) -> Result<Vec<Option<u32>>> {
        let keys = self.keys().as_ref();
        match self.fences.get_or_init(|| Fences::of(keys)) {
            Some(fences) => find_fenced(keys, fences, probes),
            None => find(keys, probes),
        }
    }

    /// The batch as stored: data columns, then `__deleted` unless a base.
    pub fn batch(&self) -> &RecordBatch {
        &self.batch
    }

    pub fn key_column(&self) -> &str {
        self.batch.schema_ref().field(self.key_col).name()
    }

    pub(crate) fn key_index(&self) -> usize {
        self.key_col
    }

    /// The sorted key column.
    pub fn keys(&self) -> &ArrayRef {
        self.batch.column(self.key_col)
    }

    /// The table's columns, without `__deleted`.
    pub fn data_columns(&self) -> &[ArrayRef] {
        &self.batch.columns()[..self.data_len()]
    }

    /// The fields of [`Self::data_columns`].
    pub fn data_fields(&self) -> &[FieldRef] {
        &self.batch.schema_ref().fields()[..self.data_len()]
    }

    fn data_len(&self) -> usize {
        self.batch.num_columns() - usize::from(self.tombstones.is_some())
    }

    /// Smallest and largest key; `None` if the run is empty.
    pub fn key_range(&self) -> Option<&KeyRange> {
        self.range.as_ref()
    }

    /// Rows, tombstones included.
    pub fn len(&self) -> usize {
        self.batch.num_rows()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether this is a base (no `__deleted` column: every row live, the
    /// whole state as of this run).
    pub fn is_base(&self) -> bool {
        self.tombstones.is_none()
    }

    /// The `__deleted` column; `None` for a base.
    pub fn tombstones(&self) -> Option<&BooleanArray> {
        self.tombstones.as_ref()
    }

    pub fn tombstone_count(&self) -> usize {
        self.tombstones.as_ref().map_or(0, BooleanArray::true_count)
    }

    /// Whether row `row` is a tombstone.
    #[inline]
    pub fn is_deleted(&self, row: usize) -> bool {
        self.tombstones.as_ref().is_some_and(|t| t.value(row))
    }

    /// The run's filter; `None` if it has none ([`Self::from_sorted_unfiltered`]).
    pub fn filter(&self) -> Option<&BloomFilter> {
        self.filter.as_ref()
    }

    /// The filter as stored beside the run ([`Self::from_parts`] reads it);
    /// `None` if it has none.
    pub fn filter_bytes(&self) -> Option<Vec<u8>> {
        self.filter.as_ref().map(BloomFilter::to_bytes)
    }

    /// Whether a key of this hash ([`super::hash`]) may be in the run by its
    /// filter (true without one).
    #[inline]
    pub fn filter_may_contain(&self, hash: u64) -> bool {
        self.filter.as_ref().is_none_or(|f| f.may_contain(hash))
    }

    /// False: the run does not hold `key` (outside its range, or not in its
    /// filter). True: it may.
    pub fn may_contain(&self, key: KeyRef<'_>) -> bool {
        self.range.as_ref().is_some_and(|r| r.contains(key)) && self.filter_may_contain(key.hash())
    }

    /// Memory held: the batch's Arrow buffers, the filter and the fences once made.
    pub fn size_bytes(&self) -> usize {
        self.batch.get_array_memory_size()
            + self.filter.as_ref().map_or(0, BloomFilter::len_bytes)
            + (self.fences.get().and_then(Option::as_ref)).map_or(0, Fences::len_bytes)
    }
}

/// Checks that `run` has the columns `fields` (names and types, in order,
/// `__deleted` aside) keyed by column `key_col`; `what` says where.
pub(crate) fn check_columns(
    run: &Run,
    fields: &[FieldRef],
    key_col: usize,
    what: &str,
) -> Result<()> {
    let theirs = run.data_fields();
    let same = run.key_col == key_col
        && theirs.len() == fields.len()
        && theirs
            .iter()
            .zip(fields)
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
    if same {
        return Ok(());
    }
    let describe = |fields: &[FieldRef], key: usize| {
        let columns: Vec<String> = fields
            .iter()
            .map(|f| format!("{}: {}", f.name(), f.data_type()))
            .collect();
        format!("({}) keyed by '{}'", columns.join(", "), fields[key].name())
    };
    Err(Error::Config(format!(
        "{what}: a run with columns {} does not fit columns {}; every run of a state has the \
         table's columns in the table's order",
        describe(theirs, run.key_col),
        describe(fields, key_col)
    )))
}
