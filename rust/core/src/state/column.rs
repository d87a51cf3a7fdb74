//! Columnar slot storage: one typed vector per schema column, indexed by slot.
//!
//! Columnar rather than row form because every bulk path is per column: an
//! upsert batch arrives as Arrow columns (one typed loop per column, no
//! per-row dynamic dispatch), and a checkpoint gathers changed slots back into
//! Arrow columns. Numeric values cost no allocation per row.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{
    Array, ArrayRef, ArrowPrimitiveType, BooleanArray, GenericByteArray, PrimitiveArray,
};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, TimeUnit};

use crate::error::{Error, Result};

/// One column of slot storage.
pub(crate) trait Column: Send + Sync {
    /// Grows or shrinks to `len` slots (new slots hold null/default).
    fn resize(&mut self, len: usize);
    /// Writes row `i` of `array` into slot `slots[i]`, in row order (a later
    /// row wins over an earlier one on the same slot).
    fn scatter(&mut self, slots: &[u32], array: &dyn Array);
    /// Builds an Arrow array of the given slots, in order.
    fn gather(&self, slots: &[u32]) -> ArrayRef;
    /// Bytes allocated for the slots (their capacity, not their number; a
    /// byte column's values on the heap aside): what a memory budget counts.
    fn allocated_bytes(&self) -> usize;
}

/// Storage for a column of `data_type`, or `None` if the type is unsupported.
pub(crate) fn new_column(data_type: &DataType, nullable: bool) -> Option<Box<dyn Column>> {
    use DataType as D;
    macro_rules! prim {
        ($t:ty) => {
            Some(Box::new(PrimColumn::<$t>::new(data_type.clone(), nullable)) as Box<dyn Column>)
        };
    }
    match data_type {
        D::Boolean => Some(Box::new(BoolColumn::default())),
        D::Int8 => prim!(Int8Type),
        D::Int16 => prim!(Int16Type),
        D::Int32 => prim!(Int32Type),
        D::Int64 => prim!(Int64Type),
        D::UInt8 => prim!(UInt8Type),
        D::UInt16 => prim!(UInt16Type),
        D::UInt32 => prim!(UInt32Type),
        D::UInt64 => prim!(UInt64Type),
        D::Float32 => prim!(Float32Type),
        D::Float64 => prim!(Float64Type),
        D::Date32 => prim!(Date32Type),
        D::Date64 => prim!(Date64Type),
        D::Timestamp(TimeUnit::Second, _) => prim!(TimestampSecondType),
        D::Timestamp(TimeUnit::Millisecond, _) => prim!(TimestampMillisecondType),
        D::Timestamp(TimeUnit::Microsecond, _) => prim!(TimestampMicrosecondType),
        D::Timestamp(TimeUnit::Nanosecond, _) => prim!(TimestampNanosecondType),
        D::Duration(TimeUnit::Second) => prim!(DurationSecondType),
        D::Duration(TimeUnit::Millisecond) => prim!(DurationMillisecondType),
        D::Duration(TimeUnit::Microsecond) => prim!(DurationMicrosecondType),
        D::Duration(TimeUnit::Nanosecond) => prim!(DurationNanosecondType),
        D::Utf8 => Some(Box::new(BytesColumn::<Utf8Type>::default())),
        D::LargeUtf8 => Some(Box::new(BytesColumn::<LargeUtf8Type>::default())),
        D::Binary => Some(Box::new(BytesColumn::<BinaryType>::default())),
        D::LargeBinary => Some(Box::new(BytesColumn::<LargeBinaryType>::default())),
        _ => None,
    }
}

/// The data types a state column may have, for error messages.
pub(crate) const SUPPORTED_TYPES: &str = "Boolean, Int8..Int64, UInt8..UInt64, Float32, Float64, \
     Date32, Date64, Timestamp, Duration, Utf8, LargeUtf8, Binary, LargeBinary";

/// Validity kept as a byte per slot: scattered writes stay a plain store.
#[derive(Default)]
struct Validity(Vec<bool>);

impl Validity {
    fn allocated_bytes(&self) -> usize {
        self.0.capacity()
    }

    fn nulls(&self, slots: &[u32]) -> Option<NullBuffer> {
        let valid: Vec<bool> = slots.iter().map(|&s| self.0[s as usize]).collect();
        let nulls = NullBuffer::from(valid);
        (nulls.null_count() > 0).then_some(nulls)
    }
}

struct PrimColumn<T: ArrowPrimitiveType> {
    data_type: DataType,
    values: Vec<T::Native>,
    /// Validity per slot; `None` for a non-nullable column (one memory
    /// access per value instead of two on the scattered paths).
    valid: Option<Validity>,
}

impl<T: ArrowPrimitiveType> PrimColumn<T> {
    fn new(data_type: DataType, nullable: bool) -> Self {
        Self {
            data_type,
            values: Vec::new(),
            valid: nullable.then(Validity::default),
        }
    }
}

impl<T: ArrowPrimitiveType> Column for PrimColumn<T> {
    fn resize(&mut self, len: usize) {
        self.values.resize(len, T::Native::default());
        if let Some(valid) = &mut self.valid {
            valid.0.resize(len, false);
        }
    }

    fn scatter(&mut self, slots: &[u32], array: &dyn Array) {
        let array = array.as_primitive::<T>();
        let values = array.values();
        for (&slot, &v) in slots.iter().zip(values.iter()) {
            self.values[slot as usize] = v;
        }
        if let Some(valid) = &mut self.valid {
            for (i, &slot) in slots.iter().enumerate() {
                valid.0[slot as usize] = array.is_valid(i);
            }
        }
    }

    fn gather(&self, slots: &[u32]) -> ArrayRef {
        let values: Vec<T::Native> = slots.iter().map(|&s| self.values[s as usize]).collect();
        let nulls = self.valid.as_ref().and_then(|v| v.nulls(slots));
        let array = PrimitiveArray::<T>::new(ScalarBuffer::from(values), nulls)
            .with_data_type(self.data_type.clone());
        Arc::new(array)
    }

    fn allocated_bytes(&self) -> usize {
        self.values.capacity() * std::mem::size_of::<T::Native>()
            + self.valid.as_ref().map_or(0, Validity::allocated_bytes)
    }
}

#[derive(Default)]
struct BoolColumn {
    values: Vec<bool>,
    valid: Validity,
}

impl Column for BoolColumn {
    fn resize(&mut self, len: usize) {
        self.values.resize(len, false);
        self.valid.0.resize(len, false);
    }

    fn scatter(&mut self, slots: &[u32], array: &dyn Array) {
        let array = array.as_boolean();
        for (i, &slot) in slots.iter().enumerate() {
            self.values[slot as usize] = array.value(i);
            self.valid.0[slot as usize] = array.is_valid(i);
        }
    }

    fn gather(&self, slots: &[u32]) -> ArrayRef {
        let values: BooleanBuffer = slots.iter().map(|&s| self.values[s as usize]).collect();
        Arc::new(BooleanArray::new(values, self.valid.nulls(slots)))
    }

    fn allocated_bytes(&self) -> usize {
        self.values.capacity() + self.valid.allocated_bytes()
    }
}

/// Strings and binaries: one boxed byte slice per slot (`None` = null).
struct BytesColumn<T: ByteArrayType> {
    values: Vec<Option<Box<[u8]>>>,
    _type: std::marker::PhantomData<T>,
}

impl<T: ByteArrayType> Default for BytesColumn<T> {
    fn default() -> Self {
        Self {
            values: Vec::new(),
            _type: std::marker::PhantomData,
        }
    }
}

impl<T: ByteArrayType> Column for BytesColumn<T> {
    fn resize(&mut self, len: usize) {
        self.values.resize(len, None);
    }

    fn scatter(&mut self, slots: &[u32], array: &dyn Array) {
        let array = array.as_bytes::<T>();
        for (i, &slot) in slots.iter().enumerate() {
            self.values[slot as usize] = array.is_valid(i).then(|| {
                let bytes: &[u8] = array.value(i).as_ref();
                Box::from(bytes)
            });
        }
    }

    fn gather(&self, slots: &[u32]) -> ArrayRef {
        let mut offsets: Vec<T::Offset> = Vec::with_capacity(slots.len() + 1);
        let mut data: Vec<u8> = Vec::new();
        let mut valid = Vec::with_capacity(slots.len());
        offsets.push(T::Offset::default());
        for &s in slots {
            let value = self.values[s as usize].as_deref();
            data.extend_from_slice(value.unwrap_or_default());
            valid.push(value.is_some());
            offsets.push(offset::<T>(data.len()));
        }
        let nulls = NullBuffer::from(valid);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
        // The bytes were valid for T when they came in, so re-validation (utf8)
        // cannot fail; `new` still checks them.
        Arc::new(GenericByteArray::<T>::new(
            offsets,
            Buffer::from_vec(data),
            nulls,
        ))
    }

    fn allocated_bytes(&self) -> usize {
        self.values.capacity() * std::mem::size_of::<Option<Box<[u8]>>>()
    }
}

fn offset<T: ByteArrayType>(len: usize) -> T::Offset {
    <T::Offset as arrow_buffer::ArrowNativeType>::from_usize(len)
        .expect("state column exceeds its offset range")
}

/// Checks that `data_type` is storable, with a message naming the column.
pub(crate) fn check_supported(name: &str, data_type: &DataType) -> Result<()> {
    if new_column(data_type, true).is_none() {
        return Err(Error::Config(format!(
            "state column '{name}' has unsupported type {data_type}; supported: {SUPPORTED_TYPES}"
        )));
    }
    Ok(())
}
