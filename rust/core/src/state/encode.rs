//! Composite keys: several key columns as one Binary state key per row.
//!
//! The bytes are arrow-row's row format: a pure function of the values and
//! the column types (no per-process dictionary or hashing seed), so every
//! process encodes equal rows alike, and distinct rows differ (each value is
//! length- or width-delimited, nulls have their own marker). Only a change
//! of the arrow-row major version could change them; a golden test pins
//! them, so an upgrade that does fails loudly instead of orphaning state.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type};
use arrow_array::{Array, ArrayRef, BinaryArray};
use arrow_row::{RowConverter, SortField};
use arrow_schema::DataType;

use crate::error::{Error, Result};

/// One Binary key per row of `columns` (all of one length; nulls allowed):
/// equal rows, and only those, get equal bytes, in every process, for
/// columns of the same types. Floats are grouped as Spark groups them:
/// -0.0 as 0.0 and every NaN as one NaN.
pub fn encode_keys(columns: &[ArrayRef]) -> Result<BinaryArray> {
    let Some(first) = columns.first() else {
        return Err(Error::Config(
            "encode_keys needs at least one key column".into(),
        ));
    };
    if let Some((i, c)) = columns
        .iter()
        .enumerate()
        .find(|(_, c)| c.len() != first.len())
    {
        return Err(Error::Config(format!(
            "encode_keys: key column {i} has {} rows, column 0 has {}; key columns must be \
             of one length",
            c.len(),
            first.len()
        )));
    }
    let fields: Vec<SortField> = columns
        .iter()
        .map(|c| SortField::new(c.data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields).map_err(|e| {
        Error::Config(format!(
            "encode_keys: unsupported key column type ({e}); cast the column to a plain type"
        ))
    })?;
    let columns: Vec<ArrayRef> = columns.iter().map(normalize_floats).collect();
    let rows = converter
        .convert_columns(&columns)
        .map_err(|e| Error::Config(format!("encode_keys: {e}")))?;
    rows.try_into_binary().map_err(|e| {
        Error::Config(format!(
            "encode_keys: {e}; encode fewer rows at a time (the keys exceed 2 GiB)"
        ))
    })
}

/// Spark's grouping equality for floats (NormalizeFloatingNumbers).
fn normalize_floats(c: &ArrayRef) -> ArrayRef {
    match c.data_type() {
        DataType::Float64 => Arc::new(c.as_primitive::<Float64Type>().unary::<_, Float64Type>(
            |v| {
                if v.is_nan() {
                    f64::NAN
                } else if v == 0.0 {
                    0.0
                } else {
                    v
                }
            },
        )),
        DataType::Float32 => Arc::new(c.as_primitive::<Float32Type>().unary::<_, Float32Type>(
            |v| {
                if v.is_nan() {
                    f32::NAN
                } else if v == 0.0 {
                    0.0
                } else {
                    v
                }
            },
        )),
        _ => c.clone(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow_array::{Float64Array, Int32Array, Int64Array, LargeStringArray, StringArray};

    use super::*;

    fn enc(columns: Vec<ArrayRef>) -> Vec<Vec<u8>> {
        let keys = encode_keys(&columns).unwrap();
        assert_eq!(keys.null_count(), 0);
        keys.iter().map(|k| k.unwrap().to_vec()).collect()
    }

    #[test]
    fn injective_over_mixed_types() {
        // Rows that concatenation without delimiters would confuse
        // ("ab" + "c" vs "a" + "bc"), nulls vs empty strings vs zero.
        let s1 = StringArray::from(vec![Some("ab"), Some("a"), None, Some(""), Some(""), None]);
        let s2 = StringArray::from(vec![Some("c"), Some("bc"), Some(""), None, Some(""), None]);
        let n = Int64Array::from(vec![Some(1), Some(1), Some(0), Some(0), None, Some(0)]);
        let f = Float64Array::from(vec![1.5, 1.5, 0.0, 0.0, 0.0, f64::INFINITY]);
        let rows = enc(vec![Arc::new(s1), Arc::new(s2), Arc::new(n), Arc::new(f)]);
        let mut seen = HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(seen.insert(r.clone(), i), None, "row {i} collides");
        }
    }

    #[test]
    fn equal_rows_equal_bytes_and_deterministic() {
        let cols = || -> Vec<ArrayRef> {
            vec![
                Arc::new(Int32Array::from(vec![Some(7), Some(7), None, Some(7)])),
                Arc::new(StringArray::from(vec![
                    Some("x"),
                    Some("x"),
                    Some("x"),
                    Some("y"),
                ])),
            ]
        };
        let a = enc(cols());
        assert_eq!(a[0], a[1]);
        assert_ne!(a[0], a[2]);
        assert_ne!(a[0], a[3]);
        assert_eq!(a, enc(cols()));
        // Sliced input encodes its own rows only.
        let sliced: Vec<ArrayRef> = cols().iter().map(|c| c.slice(2, 2)).collect();
        assert_eq!(enc(sliced), a[2..].to_vec());
    }

    #[test]
    fn floats_group_like_spark() {
        let f = Float64Array::from(vec![0.0, -0.0, f64::NAN, -f64::NAN, 1.0]);
        let rows = enc(vec![Arc::new(f)]);
        assert_eq!(rows[0], rows[1]);
        assert_eq!(rows[2], rows[3]);
        assert_ne!(rows[0], rows[4]);
        assert_ne!(rows[0], rows[2]);
    }

    #[test]
    fn golden_bytes_pin_the_format() {
        // If a dependency upgrade changes these, stored binary keys would no
        // longer match newly encoded ones: keep the old encoding or migrate.
        let rows = enc(vec![
            Arc::new(Int64Array::from(vec![Some(1), None])),
            Arc::new(StringArray::from(vec![Some("ab"), Some("")])),
        ]);
        // Int64 1: valid marker, big-endian with the sign bit flipped;
        // "ab": valid marker, a block padded with zeros, its length.
        assert_eq!(
            rows[0],
            [1, 128, 0, 0, 0, 0, 0, 0, 1, 2, b'a', b'b', 0, 0, 0, 0, 0, 0, 2]
        );
        // A null Int64 and "" (not null, empty).
        assert_eq!(rows[1], [0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn utf8_and_large_utf8_encode_alike() {
        let a = enc(vec![Arc::new(StringArray::from(vec!["k1", "k2"]))]);
        let b = enc(vec![Arc::new(LargeStringArray::from(vec!["k1", "k2"]))]);
        assert_eq!(a, b);
    }

    #[test]
    fn bad_input_is_a_config_error() {
        let err = encode_keys(&[]).unwrap_err().to_string();
        assert!(err.contains("at least one key column"), "{err}");
        let err = encode_keys(&[
            Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef,
            Arc::new(Int64Array::from(vec![1])),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("one length"), "{err}");
    }
}
