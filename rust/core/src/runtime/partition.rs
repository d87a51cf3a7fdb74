//! Hash partitioning of a batch by a key column: one hash per row, one
//! `take` per receiving subtask, no per-record allocation.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrowPrimitiveType, RecordBatch, UInt32Array};
use arrow_schema::DataType;

use crate::error::{Error, Result};

/// Mixes a 64-bit key (the murmur3 finaliser): stable across runs and machines.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Hash of a string key (FNV-1a, then mixed).
#[inline]
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix64(h)
}

/// Maps a hash to `0..n` without a division (Lemire's multiply-shift).
#[inline]
pub fn bucket(hash: u64, n: usize) -> usize {
    ((hash as u128 * n as u128) >> 64) as usize
}

/// The subtask (of `n`) a key goes to; the same for equal keys of any integer width.
pub fn subtask_for_int(key: i64, n: usize) -> usize {
    bucket(mix64(key as u64), n)
}

/// The subtask (of `n`) a string key goes to.
pub fn subtask_for_str(key: &str, n: usize) -> usize {
    bucket(hash_bytes(key.as_bytes()), n)
}

/// Reusable per-partition row-index buffers.
#[derive(Default)]
pub struct Partitioner {
    rows: Vec<Vec<u32>>,
}

impl Partitioner {
    /// Splits `batch` by `key` into `n` parts; calls `out(part, sub_batch)` for
    /// every non-empty part, in part order.
    pub fn split(
        &mut self,
        batch: &RecordBatch,
        key: &str,
        n: usize,
        mut out: impl FnMut(usize, RecordBatch) -> Result<()>,
    ) -> Result<()> {
        if n == 1 {
            return out(0, batch.clone());
        }
        let col = batch.column_by_name(key).ok_or_else(|| {
            let names: Vec<_> = batch
                .schema_ref()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
            Error::Task(format!(
                "hash partitioning key column {key:?} is not in the batch (columns: {})",
                names.join(", ")
            ))
        })?;
        self.rows.resize_with(n, Vec::new);
        for r in &mut self.rows {
            r.clear();
        }
        let rows = &mut self.rows;
        let mut put = |i: usize, hash: u64| rows[bucket(hash, n)].push(i as u32);
        match col.data_type() {
            DataType::Int64 => ints::<Int64Type>(col.as_ref(), &mut put),
            DataType::Int32 => ints::<Int32Type>(col.as_ref(), &mut put),
            DataType::Int16 => ints::<Int16Type>(col.as_ref(), &mut put),
            DataType::Int8 => ints::<Int8Type>(col.as_ref(), &mut put),
            DataType::UInt64 => ints::<UInt64Type>(col.as_ref(), &mut put),
            DataType::UInt32 => ints::<UInt32Type>(col.as_ref(), &mut put),
            DataType::UInt16 => ints::<UInt16Type>(col.as_ref(), &mut put),
            DataType::UInt8 => ints::<UInt8Type>(col.as_ref(), &mut put),
            DataType::Utf8 => {
                let a = col.as_string::<i32>();
                for i in 0..a.len() {
                    put(i, if a.is_null(i) { 0 } else { hash_bytes(a.value(i).as_bytes()) });
                }
            }
            DataType::LargeUtf8 => {
                let a = col.as_string::<i64>();
                for i in 0..a.len() {
                    put(i, if a.is_null(i) { 0 } else { hash_bytes(a.value(i).as_bytes()) });
                }
            }
            other => {
                return Err(Error::Task(format!(
                    "hash partitioning key column {key:?} has type {other}; use an integer or string column"
                )))
            }
        }
        for (part, rows) in self.rows.iter_mut().enumerate() {
            if rows.is_empty() {
                continue;
            }
            if rows.len() == batch.num_rows() {
                out(part, batch.clone())?;
                continue;
            }
            let idx = UInt32Array::from(std::mem::take(rows));
            let sub = arrow_select::take::take_record_batch(batch, &idx)
                .map_err(|e| Error::Task(format!("hash partitioning failed: {e}")))?;
            out(part, sub)?;
        }
        Ok(())
    }
}

fn ints<T>(col: &dyn Array, put: &mut impl FnMut(usize, u64))
where
    T: ArrowPrimitiveType,
    T::Native: Into<i128>,
{
    let a = col.as_primitive::<T>();
    let values = a.values();
    if a.null_count() == 0 {
        for (i, &v) in values.iter().enumerate() {
            put(i, mix64(Into::<i128>::into(v) as i64 as u64));
        }
    } else {
        for (i, &v) in values.iter().enumerate() {
            put(
                i,
                if a.is_null(i) {
                    0
                } else {
                    mix64(Into::<i128>::into(v) as i64 as u64)
                },
            );
        }
    }
}
