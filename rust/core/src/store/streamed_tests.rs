//! A streamed file is the bytes `FileWriter` writes for the same rows.

use std::sync::Arc;

use arrow_array::{
    ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, LargeBinaryArray, RecordBatch,
    StringArray,
};
use arrow_schema::{DataType, Field, Schema};
use proptest::prelude::*;

use super::StreamedFile;
use crate::store::format::{decode_ipc, encode_ipc};

pub(crate) fn batch(rows: usize, seed: u64) -> RecordBatch {
    // A cheap deterministic mix: which rows are null, and their values.
    let bit = |i: usize, salt: u64| (i as u64 * 2654435761 + seed * 97 + salt) % 5 == 0;
    let schema = Arc::new(Schema::new_with_metadata(
        vec![
            Field::new("k", DataType::Int64, false),
            Field::new("i", DataType::Int32, true),
            Field::new("f", DataType::Float64, true),
            Field::new("b", DataType::Boolean, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("p", DataType::LargeBinary, true),
            Field::new("__deleted", DataType::Boolean, false),
        ],
        [("snapcut.key".to_string(), "k".to_string())].into(),
    ));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(
            (0..rows).map(|i| i as i64 * 3),
        )),
        Arc::new(Int32Array::from_iter(
            (0..rows).map(|i| (!bit(i, 1)).then_some(i as i32)),
        )),
        Arc::new(Float64Array::from_iter(
            (0..rows).map(|i| (!bit(i, 2)).then_some(i as f64 / 7.0)),
        )),
        Arc::new(BooleanArray::from_iter(
            (0..rows).map(|i| (!bit(i, 3)).then_some(bit(i, 4))),
        )),
        Arc::new(StringArray::from_iter((0..rows).map(|i| {
            (!bit(i, 5)).then(|| "x".repeat((i * 7 + seed as usize) % 13))
        }))),
        Arc::new(LargeBinaryArray::from_iter(
            (0..rows).map(|i| (!bit(i, 6)).then(|| vec![i as u8; i % 5])),
        )),
        Arc::new(BooleanArray::from_iter((0..rows).map(|i| Some(bit(i, 7))))),
    ];
    RecordBatch::try_new(schema, columns).unwrap()
}

pub(crate) fn streamed(whole: &RecordBatch, chunk: usize) -> (Vec<u8>, super::Written) {
    let dir = tempfile::tempdir().unwrap();
    let mut file = StreamedFile::new(whole.schema(), dir.path(), "t").unwrap();
    let mut at = 0;
    while at < whole.num_rows() {
        let n = chunk.min(whole.num_rows() - at);
        // Slices: the chunks' arrays start at offsets inside their buffers.
        file.push(&whole.slice(at, n)).unwrap();
        at += n;
    }
    assert_eq!(file.rows(), whole.num_rows());
    let (bytes, written) = file.finish(Vec::new(), "t").unwrap();
    file_count_after(dir.path());
    (bytes, written)
}

/// The spools are gone once the file is finished.
fn file_count_after(dir: &std::path::Path) {
    assert_eq!(
        std::fs::read_dir(dir).unwrap().count(),
        0,
        "spool files left"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_streamed_file_is_the_file_writer_s_bytes(
        rows in 0usize..400,
        chunk in 1usize..9,
        seed in 0u64..1000,
    ) {
        let whole = batch(rows, seed);
        let (bytes, written) = streamed(&whole, chunk * 8);
        let (expected, w) = encode_ipc(&whole.schema(), std::slice::from_ref(&whole), "t").unwrap();
        prop_assert_eq!(&bytes, &expected);
        prop_assert_eq!(written, w);
        let (_, batches) = decode_ipc(bytes, "t").unwrap();
        prop_assert_eq!(batches.len(), 1);
        prop_assert_eq!(&batches[0], &whole);
    }
}

#[test]
fn only_the_last_chunk_may_end_inside_a_byte() {
    let whole = batch(30, 1);
    let dir = tempfile::tempdir().unwrap();
    let mut file = StreamedFile::new(whole.schema(), dir.path(), "t").unwrap();
    file.push(&whole.slice(0, 13)).unwrap();
    let err = file.push(&whole.slice(13, 8)).unwrap_err().to_string();
    assert!(err.contains("multiple of 8"), "{err}");
}

#[test]
fn a_chunk_of_other_columns_and_a_nested_column_are_refused() {
    let whole = batch(16, 1);
    let dir = tempfile::tempdir().unwrap();
    let mut file = StreamedFile::new(whole.schema(), dir.path(), "t").unwrap();
    let other = whole.project(&[0, 1]).unwrap();
    let err = file.push(&other).unwrap_err().to_string();
    assert!(
        err.contains("has columns (k: Int64, i: Int32) where the file has"),
        "{err}"
    );
    let list = Schema::new(vec![Field::new(
        "l",
        DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true))),
        true,
    )]);
    assert!(!StreamedFile::supports(&list));
    let err = StreamedFile::new(Arc::new(list), dir.path(), "t")
        .unwrap_err()
        .to_string();
    assert!(err.contains("column 'l' of type List"), "{err}");
    assert!(err.contains("write the batch whole"), "{err}");
}
