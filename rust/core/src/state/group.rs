//! Groups a batch's rows by key in one hash pass, borrowing byte keys from
//! the Arrow buffers (no allocation per row).

use std::hash::Hash;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    BinaryType, ByteArrayType, Int32Type, Int64Type, LargeBinaryType, LargeUtf8Type, Utf8Type,
};
use arrow_array::{Array, UInt32Array};
use arrow_schema::DataType;
use rustc_hash::FxHashMap;

/// The rows of a batch grouped by key.
#[derive(Debug)]
pub(crate) struct Groups {
    /// The group of every row.
    pub(crate) of_row: Vec<u32>,
    /// The first row of every group; groups are numbered in order of first
    /// appearance.
    pub(crate) first_row: Vec<u32>,
}

impl Groups {
    pub(crate) fn len(&self) -> usize {
        self.first_row.len()
    }

    /// Indices taking one row per group (its first) from the batch.
    pub(crate) fn first_rows(&self) -> UInt32Array {
        UInt32Array::from(self.first_row.clone())
    }
}

fn group_by<K: Hash + Eq>(n: usize, key: impl Fn(usize) -> K) -> Groups {
    let mut ids: FxHashMap<K, u32> = FxHashMap::default();
    let mut first_row = Vec::new();
    let of_row = (0..n)
        .map(|i| {
            *ids.entry(key(i)).or_insert_with(|| {
                first_row.push(i as u32);
                (first_row.len() - 1) as u32
            })
        })
        .collect();
    Groups { of_row, first_row }
}

fn group_bytes<T: ByteArrayType>(keys: &dyn Array) -> Groups
where
    T::Native: AsRef<[u8]>,
{
    let a = keys.as_bytes::<T>();
    group_by(a.len(), |i| a.value(i).as_ref())
}

/// Groups the rows of `keys`, a key column (Int64, Int32, Utf8, LargeUtf8,
/// Binary or LargeBinary) without nulls.
pub(crate) fn group_rows(keys: &dyn Array) -> Groups {
    debug_assert_eq!(
        keys.null_count(),
        0,
        "null keys are rejected before grouping"
    );
    match keys.data_type() {
        DataType::Int64 => {
            let v = keys.as_primitive::<Int64Type>().values();
            group_by(v.len(), |i| v[i])
        }
        DataType::Int32 => {
            let v = keys.as_primitive::<Int32Type>().values();
            group_by(v.len(), |i| v[i])
        }
        DataType::Utf8 => group_bytes::<Utf8Type>(keys),
        DataType::LargeUtf8 => group_bytes::<LargeUtf8Type>(keys),
        DataType::Binary => group_bytes::<BinaryType>(keys),
        DataType::LargeBinary => group_bytes::<LargeBinaryType>(keys),
        other => unreachable!("key type {other} was validated"),
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int64Array, StringArray};

    use super::*;

    #[test]
    fn groups_in_order_of_first_appearance() {
        let g = group_rows(&Int64Array::from(vec![7, 3, 7, 9, 3]));
        assert_eq!(g.of_row, vec![0, 1, 0, 2, 1]);
        assert_eq!(g.first_row, vec![0, 1, 3]);
        let g = group_rows(&StringArray::from(vec!["b", "a", "b"]));
        assert_eq!(g.of_row, vec![0, 1, 0]);
        assert_eq!(g.first_row, vec![0, 1]);
    }
}
