//! Keys read in place from a key column, in the order runs are sorted by:
//! integers as numbers (an `Int32` key widened to `i64`), strings and bytes
//! as bytes (UTF-8's byte order is its code point order). It is the order of
//! [`super::sorted`] and of [`Key`]'s `Ord`, so a run's [`KeyRange`] can be
//! kept as two [`Key`]s and compared with borrowed probes without copying
//! them. Sorting a batch, merging runs and pruning probes by range read keys
//! this way; the hot search in a run stays typed ([`super::sorted::find`]).

use std::fmt;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::Array;
use arrow_schema::DataType;

use super::hash::{hash_bytes, hash_int};
use crate::error::{Error, Result};
use crate::state::key::{Key, KeyType};

/// A key borrowed from a column: [`Key`] without the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeyRef<'a> {
    Int(i64),
    Bytes(&'a [u8]),
}

impl<'a> KeyRef<'a> {
    pub fn of(key: &'a Key) -> Self {
        match key {
            Key::Int(v) => KeyRef::Int(*v),
            Key::Bytes(b) => KeyRef::Bytes(b),
        }
    }

    pub fn to_key(self) -> Key {
        match self {
            KeyRef::Int(v) => Key::Int(v),
            KeyRef::Bytes(b) => Key::Bytes(Box::from(b)),
        }
    }

    /// The filter hash ([`super::hash`]), as [`super::sorted::hashes`] computes it.
    #[inline]
    pub fn hash(self) -> u64 {
        match self {
            KeyRef::Int(v) => hash_int(v),
            KeyRef::Bytes(b) => hash_bytes(b),
        }
    }
}

/// For error messages: a number, a quoted string, or hex for bytes that are
/// not UTF-8.
impl fmt::Display for KeyRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyRef::Int(v) => write!(f, "{v}"),
            KeyRef::Bytes(b) => match std::str::from_utf8(b) {
                Ok(s) => write!(f, "{s:?}"),
                Err(_) => {
                    write!(f, "0x")?;
                    b.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
                }
            },
        }
    }
}

/// A key column's values, read by position as [`KeyRef`]s. Strings and
/// binaries share their layout (offsets into one data buffer), so four cases
/// cover the six key types.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KeyColumn<'a> {
    Int64(&'a [i64]),
    Int32(&'a [i32]),
    Bytes32 { offsets: &'a [i32], data: &'a [u8] },
    Bytes64 { offsets: &'a [i64], data: &'a [u8] },
}

impl<'a> KeyColumn<'a> {
    /// `array` must have a key type; nulls are the caller's to refuse (a
    /// null reads as whatever its slot holds).
    pub(crate) fn new(array: &'a dyn Array) -> Result<Self> {
        KeyType::new("key", array.data_type())?;
        Ok(match array.data_type() {
            DataType::Int64 => Self::Int64(array.as_primitive::<Int64Type>().values()),
            DataType::Int32 => Self::Int32(array.as_primitive::<Int32Type>().values()),
            DataType::Utf8 => {
                let a = array.as_string::<i32>();
                Self::Bytes32 {
                    offsets: a.value_offsets(),
                    data: a.value_data(),
                }
            }
            DataType::LargeUtf8 => {
                let a = array.as_string::<i64>();
                Self::Bytes64 {
                    offsets: a.value_offsets(),
                    data: a.value_data(),
                }
            }
            DataType::Binary => {
                let a = array.as_binary::<i32>();
                Self::Bytes32 {
                    offsets: a.value_offsets(),
                    data: a.value_data(),
                }
            }
            DataType::LargeBinary => {
                let a = array.as_binary::<i64>();
                Self::Bytes64 {
                    offsets: a.value_offsets(),
                    data: a.value_data(),
                }
            }
            _ => unreachable!("KeyType::new admits only key types"),
        })
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Int64(v) => v.len(),
            Self::Int32(v) => v.len(),
            Self::Bytes32 { offsets, .. } => offsets.len() - 1,
            Self::Bytes64 { offsets, .. } => offsets.len() - 1,
        }
    }

    #[inline]
    pub(crate) fn at(&self, i: usize) -> KeyRef<'a> {
        match *self {
            Self::Int64(v) => KeyRef::Int(v[i]),
            Self::Int32(v) => KeyRef::Int(v[i].into()),
            Self::Bytes32 { offsets, data } => {
                KeyRef::Bytes(&data[offsets[i] as usize..offsets[i + 1] as usize])
            }
            Self::Bytes64 { offsets, data } => {
                KeyRef::Bytes(&data[offsets[i] as usize..offsets[i + 1] as usize])
            }
        }
    }
    /// The rows in key order, ties in row order, and the first two rows
    /// holding the same key, if any. Integer keys sort as (key, row) pairs
    /// in place: comparing through [`Self::at`] reads the column at random
    /// for every comparison, which at millions of rows (a memtable's flush,
    /// a checkpoint's file) is cache misses, not compares.
    pub(crate) fn order(&self) -> (Vec<u32>, Option<[u32; 2]>) {
        fn by_pairs(mut pairs: Vec<(i64, u32)>) -> (Vec<u32>, Option<[u32; 2]>) {
            pairs.sort_unstable();
            let tie = pairs
                .windows(2)
                .find(|w| w[0].0 == w[1].0)
                .map(|w| [w[0].1, w[1].1]);
            (pairs.into_iter().map(|(_, row)| row).collect(), tie)
        }
        match *self {
            Self::Int64(v) => by_pairs(v.iter().copied().zip(0u32..).collect()),
            Self::Int32(v) => by_pairs(v.iter().map(|&k| i64::from(k)).zip(0u32..).collect()),
            _ => {
                let mut order: Vec<u32> = (0..self.len() as u32).collect();
                order.sort_unstable_by_key(|&i| (self.at(i as usize), i));
                let tie = order
                    .windows(2)
                    .find(|w| self.at(w[0] as usize) == self.at(w[1] as usize))
                    .map(|w| [w[0], w[1]]);
                (order, tie)
            }
        }
    }
}

/// The smallest and largest key of a run (both held): a probe outside it is
/// not in the run, whatever the filter says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub min: Key,
    pub max: Key,
}

impl KeyRange {
    /// The range of a sorted key column; `None` if it is empty.
    pub(crate) fn of_sorted(keys: &KeyColumn<'_>) -> Option<Self> {
        let n = keys.len();
        (n > 0).then(|| Self {
            min: keys.at(0).to_key(),
            max: keys.at(n - 1).to_key(),
        })
    }

    #[inline]
    pub fn contains(&self, key: KeyRef<'_>) -> bool {
        KeyRef::of(&self.min) <= key && key <= KeyRef::of(&self.max)
    }
}

/// The rows of a sorted binary key column that begin with `prefix`: one
/// range, found by two binary searches.
pub(crate) fn prefix_range(keys: &KeyColumn<'_>, prefix: &[u8]) -> std::ops::Range<usize> {
    let bytes = |i: usize| match keys.at(i) {
        KeyRef::Bytes(b) => b,
        KeyRef::Int(_) => unreachable!("checked: binary keys"),
    };
    let n = keys.len();
    let start = partition_point(0, n, |i| bytes(i) < prefix);
    let end = partition_point(start, n, |i| bytes(i).starts_with(prefix));
    start..end
}

/// The first `i` in `lo..hi` where `pred` turns false (`pred` true then false).
pub(crate) fn partition_point(mut lo: usize, mut hi: usize, pred: impl Fn(usize) -> bool) -> usize {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Each key's bucket among `buckets`, by its filter hash: a task that splits
/// its input into parts holding whole keys (every row of a key in one part)
/// puts a row in its key's bucket. The high bits of the hash pick it
/// (Lemire's multiply-shift), so the buckets are even for any count.
/// Errors on a non-key type, a null key or no buckets.
pub fn key_buckets(array: &dyn Array, buckets: u32) -> Result<Vec<u32>> {
    if buckets == 0 {
        return Err(Error::Config("key_buckets needs at least 1 bucket".into()));
    }
    if array.null_count() > 0 {
        return Err(Error::Config(format!(
            "{} null key(s): a key's bucket needs a key",
            array.null_count()
        )));
    }
    let keys = KeyColumn::new(array)?;
    Ok((0..keys.len())
        .map(|i| (((keys.at(i).hash() >> 32) * u64::from(buckets)) >> 32) as u32)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::sorted::hashes;
    use super::*;
    use arrow_array::{
        BinaryArray, Int32Array, Int64Array, LargeBinaryArray, LargeStringArray, StringArray,
    };

    fn read(array: &dyn Array) -> Vec<KeyRef<'_>> {
        let column = KeyColumn::new(array).unwrap();
        (0..column.len()).map(|i| column.at(i)).collect()
    }

    #[test]
    fn reads_every_key_type_and_hashes_like_sorted() {
        let sliced = StringArray::from(vec!["x", "é", "", "ab"]).slice(1, 3);
        assert_eq!(
            read(&sliced),
            [
                KeyRef::Bytes("é".as_bytes()),
                KeyRef::Bytes(b""),
                KeyRef::Bytes(b"ab")
            ]
        );
        let arrays: Vec<Box<dyn Array>> = vec![
            Box::new(Int64Array::from(vec![-1, 7])),
            Box::new(Int32Array::from(vec![-1, 7])),
            Box::new(LargeStringArray::from(vec!["a", "bc"])),
            Box::new(BinaryArray::from_iter_values([b"\xff", b"q"])),
            Box::new(LargeBinaryArray::from_iter_values([b"\xff", b"q"])),
            Box::new(sliced),
        ];
        for array in &arrays {
            let hashed: Vec<u64> = read(array.as_ref()).iter().map(|k| k.hash()).collect();
            assert_eq!(hashed, hashes(array.as_ref()).unwrap());
        }
        assert_eq!(read(arrays[1].as_ref()), read(arrays[0].as_ref()));
    }

    #[test]
    fn finds_the_keys_that_begin_with_a_prefix() {
        let sorted = BinaryArray::from_iter_values([
            &b""[..],
            b"a",
            b"ab",
            b"ab\x00",
            b"ab\xff",
            b"abc",
            b"ac",
            b"b",
        ]);
        let keys = KeyColumn::new(&sorted).unwrap();
        assert_eq!(prefix_range(&keys, b"ab"), 2..6);
        assert_eq!(prefix_range(&keys, b"a"), 1..7);
        assert_eq!(prefix_range(&keys, b""), 0..8);
        assert_eq!(prefix_range(&keys, b"aa"), 2..2);
        assert_eq!(prefix_range(&keys, b"c"), 8..8);
    }

    #[test]
    fn orders_and_shows_like_keys() {
        let (a, b) = (
            Key::Bytes(Box::from(&b"a"[..])),
            Key::Bytes(Box::from(&b"ab"[..])),
        );
        assert_eq!(KeyRef::of(&a) < KeyRef::of(&b), a < b);
        assert_eq!(KeyRef::of(&b).to_key(), b);
        let range = KeyRange { min: a, max: b };
        assert!(range.contains(KeyRef::Bytes(b"a")) && range.contains(KeyRef::Bytes(b"aa")));
        assert!(!range.contains(KeyRef::Bytes(b"")) && !range.contains(KeyRef::Bytes(b"b")));
        assert_eq!(KeyRef::Int(-3).to_string(), "-3");
        assert_eq!(KeyRef::Bytes(b"k\"1").to_string(), r#""k\"1""#);
        assert_eq!(KeyRef::Bytes(b"\xff\x01").to_string(), "0xff01");
        assert!(KeyColumn::new(&arrow_array::Float32Array::from(vec![1.0])).is_err());
    }

    #[test]
    fn buckets_keys_by_their_hash_evenly_and_refuses_nulls() {
        let ints = arrow_array::Int64Array::from_iter_values(0..40_000);
        let got = key_buckets(&ints, 8).unwrap();
        // The same key, the same bucket, whatever its row or type.
        let narrow = arrow_array::Int32Array::from_iter_values(0..40_000);
        assert_eq!(key_buckets(&narrow, 8).unwrap(), got);
        for (i, b) in got.iter().enumerate() {
            assert_eq!(*b, (((hash_int(i as i64) >> 32) * 8) >> 32) as u32);
        }
        let mut counts = [0usize; 8];
        got.iter().for_each(|b| counts[*b as usize] += 1);
        assert!(
            counts.iter().all(|n| (4_500..5_500).contains(n)),
            "{counts:?}"
        );
        let text = arrow_array::StringArray::from(vec!["a", "b", "a"]);
        let bytes = BinaryArray::from_iter_values([&b"a"[..], b"b", b"a"]);
        let (t, b) = (
            key_buckets(&text, 5).unwrap(),
            key_buckets(&bytes, 5).unwrap(),
        );
        assert_eq!(t, b);
        assert_eq!(t[0], t[2]);
        assert_eq!(key_buckets(&ints, 1).unwrap(), vec![0; 40_000]);
        assert!(key_buckets(&ints, 0).is_err());
        let nulls = arrow_array::Int64Array::from(vec![Some(1), None]);
        assert!(matches!(key_buckets(&nulls, 4), Err(Error::Config(m)) if m.contains("null")));
        assert!(key_buckets(&arrow_array::Float64Array::from(vec![1.0]), 4).is_err());
    }
}
