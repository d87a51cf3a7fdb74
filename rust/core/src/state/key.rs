//! The key → slot index. Integer keys hash as `i64` and byte keys as boxed
//! slices, both with FxHash (fast, and keys come from the job, not an attacker).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    BinaryType, ByteArrayType, Int32Type, Int64Type, LargeBinaryType, LargeUtf8Type, Utf8Type,
};
use arrow_array::{Array, ArrayRef, BinaryArray, Int32Array, Int64Array, LargeBinaryArray};
use arrow_array::{LargeStringArray, StringArray};
use arrow_schema::DataType;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::error::{Error, Result};

/// A key read out of an Arrow key column.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Int(i64),
    Bytes(Box<[u8]>),
}

/// Whether the key column is integer or bytes, and its exact Arrow type.
#[derive(Clone, Debug)]
pub(crate) struct KeyType(pub DataType);

impl KeyType {
    pub(crate) fn new(name: &str, data_type: &DataType) -> Result<Self> {
        match data_type {
            DataType::Int64
            | DataType::Int32
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Binary
            | DataType::LargeBinary => Ok(Self(data_type.clone())),
            other => Err(Error::Config(format!(
                "key column '{name}' has type {other}; a state key must be Int64, Int32, Utf8, \
                 LargeUtf8, Binary or LargeBinary"
            ))),
        }
    }

    pub(crate) fn is_int(&self) -> bool {
        matches!(self.0, DataType::Int64 | DataType::Int32)
    }

    /// Checks that `array` can be keys of this table: same type, no nulls.
    pub(crate) fn check(&self, name: &str, array: &dyn Array) -> Result<()> {
        if array.data_type() != &self.0 {
            return Err(Error::Config(format!(
                "key column '{name}' has type {}, the state table's key type is {}",
                array.data_type(),
                self.0
            )));
        }
        if array.null_count() > 0 {
            return Err(Error::Config(format!(
                "key column '{name}' holds {} null(s); state keys must be non-null",
                array.null_count()
            )));
        }
        Ok(())
    }

    /// Reads every key of `array` (which must have this type and no nulls).
    pub(crate) fn keys(&self, name: &str, array: &dyn Array) -> Result<Vec<Key>> {
        self.check(name, array)?;
        let bytes = |v: &[u8]| Key::Bytes(Box::from(v));
        Ok(match &self.0 {
            DataType::Int64 => array
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .map(|&v| Key::Int(v))
                .collect(),
            DataType::Int32 => array
                .as_primitive::<Int32Type>()
                .values()
                .iter()
                .map(|&v| Key::Int(v.into()))
                .collect(),
            DataType::Utf8 => array
                .as_bytes::<Utf8Type>()
                .iter()
                .flatten()
                .map(|v| bytes(v.as_bytes()))
                .collect(),
            DataType::LargeUtf8 => array
                .as_bytes::<LargeUtf8Type>()
                .iter()
                .flatten()
                .map(|v| bytes(v.as_bytes()))
                .collect(),
            DataType::Binary => array
                .as_bytes::<BinaryType>()
                .iter()
                .flatten()
                .map(bytes)
                .collect(),
            DataType::LargeBinary => array
                .as_bytes::<LargeBinaryType>()
                .iter()
                .flatten()
                .map(bytes)
                .collect(),
            _ => unreachable!("KeyType::new admits only key types"),
        })
    }

    /// An Arrow array of `keys` in this key type.
    pub(crate) fn array(&self, keys: &[Key]) -> ArrayRef {
        let int = |k: &Key| match k {
            Key::Int(v) => *v,
            Key::Bytes(_) => unreachable!("integer key table holds a byte key"),
        };
        let bytes = |k: &Key| match k {
            Key::Bytes(b) => b.to_vec(),
            Key::Int(_) => unreachable!("byte key table holds an integer key"),
        };
        let text =
            |k: &Key| String::from_utf8(bytes(k)).expect("utf8 keys were validated on input");
        match &self.0 {
            DataType::Int64 => Arc::new(Int64Array::from_iter_values(keys.iter().map(int))),
            DataType::Int32 => Arc::new(Int32Array::from_iter_values(
                keys.iter().map(|k| int(k) as i32),
            )),
            DataType::Utf8 => Arc::new(StringArray::from_iter_values(keys.iter().map(text))),
            DataType::LargeUtf8 => {
                Arc::new(LargeStringArray::from_iter_values(keys.iter().map(text)))
            }
            DataType::Binary => Arc::new(BinaryArray::from_iter_values(keys.iter().map(bytes))),
            DataType::LargeBinary => {
                Arc::new(LargeBinaryArray::from_iter_values(keys.iter().map(bytes)))
            }
            _ => unreachable!("KeyType::new admits only key types"),
        }
    }

    pub(crate) fn new_index(&self) -> KeyIndex {
        if self.is_int() {
            KeyIndex::Int(FxHashMap::default())
        } else {
            KeyIndex::Bytes(FxHashMap::default())
        }
    }

    pub(crate) fn new_set(&self) -> KeySet {
        if self.is_int() {
            KeySet::Int(FxHashSet::default())
        } else {
            KeySet::Bytes(FxHashSet::default())
        }
    }
}

/// The bytes of a hash table (key `K` → slot) holding `capacity` keys:
/// its buckets (a power of two, at most 7/8 full) of an entry and a
/// control byte each.
fn table_bytes<K>(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8 / 7 + 1).next_power_of_two();
    buckets * (std::mem::size_of::<(K, u32)>() + 1)
}

/// Key → slot. Split by key kind so integer keys hash and compare as plain `i64`.
pub(crate) enum KeyIndex {
    Int(FxHashMap<i64, u32>),
    Bytes(FxHashMap<Box<[u8]>, u32>),
}

impl KeyIndex {
    pub(crate) fn len(&self) -> usize {
        match self {
            KeyIndex::Int(m) => m.len(),
            KeyIndex::Bytes(m) => m.len(),
        }
    }

    pub(crate) fn reserve(&mut self, extra: usize) {
        match self {
            KeyIndex::Int(m) => m.reserve(extra),
            KeyIndex::Bytes(m) => m.reserve(extra),
        }
    }

    /// Bytes the hash table allocated: its buckets (a power of two, at
    /// most 7/8 full) of an entry and a control byte each; a byte key's
    /// bytes on the heap aside.
    pub(crate) fn allocated_bytes(&self) -> usize {
        match self {
            KeyIndex::Int(m) => table_bytes::<i64>(m.capacity()),
            KeyIndex::Bytes(m) => table_bytes::<Box<[u8]>>(m.capacity()),
        }
    }

    /// Bytes the hash table would allocate, beside its buckets, to take
    /// `extra` more keys: none if they fit, else a new table of at least
    /// twice the buckets (the old one is freed once the keys moved). An
    /// empty table's first room is not counted, as [`grown_bytes`].
    ///
    /// [`grown_bytes`]: super::changelog::grown_bytes
    pub(crate) fn growth_bytes(&self, extra: usize) -> usize {
        fn grown<K>(len: usize, capacity: usize, extra: usize) -> usize {
            if capacity == 0 || len + extra <= capacity {
                return 0;
            }
            table_bytes::<K>((len + extra).max(capacity + 1))
        }
        match self {
            KeyIndex::Int(m) => grown::<i64>(m.len(), m.capacity(), extra),
            KeyIndex::Bytes(m) => grown::<Box<[u8]>>(m.len(), m.capacity(), extra),
        }
    }

    /// The slot of every key of `array` (checked with [`KeyType::check`]),
    /// `None` for absent ones. Byte keys are looked up borrowed: no
    /// allocation per key, unlike [`KeyType::keys`].
    pub(crate) fn slots_of(&self, array: &dyn Array) -> Vec<Option<u32>> {
        fn bytes<T: ByteArrayType>(m: &FxHashMap<Box<[u8]>, u32>, a: &dyn Array) -> Vec<Option<u32>>
        where
            T::Native: AsRef<[u8]>,
        {
            let a = a.as_bytes::<T>();
            (0..a.len())
                .map(|i| m.get(a.value(i).as_ref()).copied())
                .collect()
        }
        match (self, array.data_type()) {
            (KeyIndex::Int(m), DataType::Int64) => array
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .map(|k| m.get(k).copied())
                .collect(),
            (KeyIndex::Int(m), DataType::Int32) => array
                .as_primitive::<Int32Type>()
                .values()
                .iter()
                .map(|&k| m.get(&i64::from(k)).copied())
                .collect(),
            (KeyIndex::Bytes(m), DataType::Utf8) => bytes::<Utf8Type>(m, array),
            (KeyIndex::Bytes(m), DataType::LargeUtf8) => bytes::<LargeUtf8Type>(m, array),
            (KeyIndex::Bytes(m), DataType::Binary) => bytes::<BinaryType>(m, array),
            (KeyIndex::Bytes(m), DataType::LargeBinary) => bytes::<LargeBinaryType>(m, array),
            _ => unreachable!("key array checked against the key type"),
        }
    }

    /// The slot of `key`, inserting it with `new_slot()` if absent; `true` if inserted.
    pub(crate) fn get_or_insert(
        &mut self,
        key: Key,
        new_slot: impl FnOnce() -> u32,
    ) -> (u32, bool) {
        use std::collections::hash_map::Entry;
        macro_rules! entry {
            ($e:expr) => {
                match $e {
                    Entry::Occupied(o) => (*o.get(), false),
                    Entry::Vacant(v) => (*v.insert(new_slot()), true),
                }
            };
        }
        match (self, key) {
            (KeyIndex::Int(m), Key::Int(k)) => entry!(m.entry(k)),
            (KeyIndex::Bytes(m), Key::Bytes(k)) => entry!(m.entry(k)),
            _ => unreachable!("key kind checked against the key type"),
        }
    }

    pub(crate) fn remove(&mut self, key: &Key) -> Option<u32> {
        match (self, key) {
            (KeyIndex::Int(m), Key::Int(k)) => m.remove(k),
            (KeyIndex::Bytes(m), Key::Bytes(k)) => m.remove(k),
            _ => None,
        }
    }

    pub(crate) fn clear(&mut self) {
        match self {
            KeyIndex::Int(m) => m.clear(),
            KeyIndex::Bytes(m) => m.clear(),
        }
    }
}

/// Keys deleted since the last checkpoint (tombstones).
pub(crate) enum KeySet {
    Int(FxHashSet<i64>),
    Bytes(FxHashSet<Box<[u8]>>),
}

impl KeySet {
    pub(crate) fn len(&self) -> usize {
        match self {
            KeySet::Int(s) => s.len(),
            KeySet::Bytes(s) => s.len(),
        }
    }

    pub(crate) fn insert(&mut self, key: Key) {
        match (self, key) {
            (KeySet::Int(s), Key::Int(k)) => {
                s.insert(k);
            }
            (KeySet::Bytes(s), Key::Bytes(k)) => {
                s.insert(k);
            }
            _ => unreachable!("key kind checked against the key type"),
        }
    }

    pub(crate) fn contains(&self, key: &Key) -> bool {
        match (self, key) {
            (KeySet::Int(s), Key::Int(k)) => s.contains(k),
            (KeySet::Bytes(s), Key::Bytes(k)) => s.contains(k),
            _ => false,
        }
    }

    pub(crate) fn remove(&mut self, key: &Key) {
        match (self, key) {
            (KeySet::Int(s), Key::Int(k)) => {
                s.remove(k);
            }
            (KeySet::Bytes(s), Key::Bytes(k)) => {
                s.remove(k);
            }
            _ => {}
        }
    }

    /// Takes every key out, leaving the set empty.
    pub(crate) fn drain(&mut self) -> Vec<Key> {
        match self {
            KeySet::Int(s) => s.drain().map(Key::Int).collect(),
            KeySet::Bytes(s) => s.drain().map(Key::Bytes).collect(),
        }
    }

    pub(crate) fn to_vec(&self) -> Vec<Key> {
        match self {
            KeySet::Int(s) => s.iter().map(|&k| Key::Int(k)).collect(),
            KeySet::Bytes(s) => s.iter().cloned().map(Key::Bytes).collect(),
        }
    }
}
