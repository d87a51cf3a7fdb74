//! A presized file is the bytes a streamed file (so `FileWriter`) writes.

use arrow_array::cast::AsArray;
use arrow_array::RecordBatch;
use arrow_schema::DataType;
use proptest::prelude::*;

use super::{ColumnSize, PresizedFile};
use crate::store::files::{Fsync, FsyncMode};
use crate::store::streamed::tests::{batch, streamed};

/// Each column's nulls and values' bytes, from the whole batch.
fn sizes(whole: &RecordBatch) -> Vec<ColumnSize> {
    (whole.columns().iter())
        .map(|c| ColumnSize {
            nulls: c.null_count(),
            value_bytes: match c.data_type() {
                DataType::Utf8 => c.as_string::<i32>().values().len() as u64,
                DataType::LargeBinary => c.as_binary::<i64>().values().len() as u64,
                _ => 0,
            },
        })
        .collect()
}

fn presized(whole: &RecordBatch, chunk: usize, sizes: &[ColumnSize]) -> crate::Result<Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.arrow");
    let mut file = PresizedFile::create(&path, whole.schema(), whole.num_rows(), sizes)?;
    let mut at = 0;
    while at < whole.num_rows() {
        let n = chunk.min(whole.num_rows() - at);
        file.push(&whole.slice(at, n))?;
        at += n;
    }
    let written = file.finish(&Fsync::new(FsyncMode::Off))?;
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(written.bytes, bytes.len() as u64);
    assert_eq!(written.crc32c, crc32c::crc32c(&bytes));
    assert_eq!(written.rows, whole.num_rows() as u64);
    Ok(bytes)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn a_presized_file_is_the_streamed_file_s_bytes(
        rows in 1usize..300,
        chunk in 1usize..40,
        seed in 0u64..1000,
    ) {
        // A multiple of 8 but the last, as a streamed file takes them.
        let chunk = chunk * 8;
        let whole = batch(rows, seed);
        let (want, written) = streamed(&whole, chunk);
        let got = presized(&whole, chunk, &sizes(&whole)).unwrap();
        prop_assert_eq!(crc32c::crc32c(&got), written.crc32c);
        prop_assert_eq!(got, want);
    }
}

#[test]
fn rows_nulls_or_bytes_other_than_sized_are_refused() {
    let whole = batch(100, 3);
    let right = sizes(&whole);
    assert!(right.iter().any(|s| s.nulls > 0) && right.iter().any(|s| s.value_bytes > 0));
    for (i, field) in [(1, "nulls"), (4, "value bytes")] {
        let mut wrong = right.clone();
        match field {
            "nulls" => wrong[i].nulls += 1,
            _ => wrong[i].value_bytes -= 1,
        }
        let err = presized(&whole, 16, &wrong).unwrap_err().to_string();
        assert!(err.contains("sized for"), "{field}: {err}");
    }
    // A column sized without nulls that gets some.
    let mut none = right.clone();
    none[1].nulls = 0;
    assert!(presized(&whole, 16, &none).is_err());
    // Fewer rows than sized, and more.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.arrow");
    let mut short = PresizedFile::create(&path, whole.schema(), 101, &right).unwrap();
    short.push(&whole).unwrap();
    let err = short.finish(&Fsync::new(FsyncMode::Off)).unwrap_err();
    assert!(
        err.to_string().contains("sized for 101 rows was given 100"),
        "{err}"
    );
    let mut long = PresizedFile::create(&path, whole.schema(), 99, &right).unwrap();
    assert!(long.push(&whole).is_err());
    assert!(PresizedFile::create(&path, whole.schema(), 100, &right[1..]).is_err());
    // A nested column is refused before any file is made.
    let nested = arrow_schema::Schema::new(vec![arrow_schema::Field::new(
        "l",
        DataType::new_list(DataType::Int64, true),
        true,
    )]);
    let other = dir.path().join("nested.arrow");
    let err = PresizedFile::create(&other, nested.into(), 1, &right[..1])
        .err()
        .unwrap();
    assert!(err.to_string().contains("is not flat"), "{err}");
    assert!(!other.exists());
}
