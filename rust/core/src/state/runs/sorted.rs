//! A run's key column is sorted ascending with no key twice; a batch's keys
//! are found in it together: the probes sorted once, then each found by a
//! galloping search that starts where the previous probe ended, so a batch
//! of `m` keys against a run of `n` costs O(m log m + m log(n / m)) compares
//! and touches the run's column front to back. Integer keys compare as
//! numbers, byte and string keys as bytes (UTF-8's byte order is its code
//! point order).

use arrow_array::cast::AsArray;
use arrow_array::types::{BinaryType, Int32Type, Int64Type, LargeBinaryType};
use arrow_array::types::{LargeUtf8Type, Utf8Type};
use arrow_array::Array;
use arrow_schema::DataType;

use super::hash::{hash_bytes, hash_int};
use crate::error::{Error, Result};
use crate::state::key::KeyType;

/// The first index in `[from, len)` whose item is not less than `key`
/// (`len` if none), galloping from `from`.
fn lower_bound<T: Ord>(len: usize, at: &impl Fn(usize) -> T, from: usize, key: &T) -> usize {
    let mut low = from;
    let mut bound = 1;
    while low + bound - 1 < len && at(low + bound - 1) < *key {
        low += bound;
        bound *= 2;
    }
    let mut high = (low + bound - 1).min(len);
    while low < high {
        let mid = low + (high - low) / 2;
        if at(mid) < *key {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    low
}

fn find_with<T: Ord>(
    run_len: usize,
    run_at: impl Fn(usize) -> T,
    probe_len: usize,
    probe_at: impl Fn(usize) -> T,
) -> Vec<Option<u32>> {
    let mut order: Vec<u32> = (0..probe_len as u32).collect();
    order.sort_unstable_by_key(|&i| probe_at(i as usize));
    let mut found = vec![None; probe_len];
    let mut from = 0;
    for p in order {
        let key = probe_at(p as usize);
        from = lower_bound(run_len, &run_at, from, &key);
        if from < run_len && run_at(from) == key {
            found[p as usize] = Some(from as u32);
        }
    }
    found
}

fn same_type(run: &dyn Array, probes: &dyn Array) -> Result<()> {
    KeyType::new("key", run.data_type())?;
    if run.data_type() != probes.data_type() {
        return Err(Error::Config(format!(
            "keys of type {} looked up in a run whose keys are {}",
            probes.data_type(),
            run.data_type()
        )));
    }
    if probes.null_count() > 0 {
        return Err(Error::Config(format!(
            "{} null key(s) looked up; state keys are non-null",
            probes.null_count()
        )));
    }
    Ok(())
}

/// Where each of `probes` is in `run` (a sorted key column, see
/// [`check_sorted`]): its row, or `None`. `probes` may be in any order and
/// hold a key more than once.
pub fn find(run: &dyn Array, probes: &dyn Array) -> Result<Vec<Option<u32>>> {
    same_type(run, probes)?;
    macro_rules! bytes {
        ($t:ty) => {{
            let (r, p) = (run.as_bytes::<$t>(), probes.as_bytes::<$t>());
            let (r_at, p_at) = (
                |i| -> &[u8] { r.value(i).as_ref() },
                |i| -> &[u8] { p.value(i).as_ref() },
            );
            find_with(r.len(), r_at, p.len(), p_at)
        }};
    }
    Ok(match run.data_type() {
        DataType::Int64 => {
            let (r, p) = (
                run.as_primitive::<Int64Type>().values(),
                probes.as_primitive::<Int64Type>().values(),
            );
            find_with(r.len(), |i| r[i], p.len(), |i| p[i])
        }
        DataType::Int32 => {
            let (r, p) = (
                run.as_primitive::<Int32Type>().values(),
                probes.as_primitive::<Int32Type>().values(),
            );
            find_with(r.len(), |i| r[i], p.len(), |i| p[i])
        }
        DataType::Utf8 => bytes!(Utf8Type),
        DataType::LargeUtf8 => bytes!(LargeUtf8Type),
        DataType::Binary => bytes!(BinaryType),
        DataType::LargeBinary => bytes!(LargeBinaryType),
        _ => unreachable!("KeyType::new admits only key types"),
    })
}

/// Checks that `run` is a run's key column: a key type, no nulls, each key
/// greater than the one before. `what` names the run for the error.
pub fn check_sorted(run: &dyn Array, what: &str) -> Result<()> {
    fn ascending<T: Ord>(len: usize, at: impl Fn(usize) -> T, what: &str) -> Result<()> {
        match (1..len).find(|&i| at(i - 1) >= at(i)) {
            None => Ok(()),
            Some(i) => Err(Error::Snapshot(format!(
                "{what}: keys {} and {i} are out of order or repeated; a run's keys are sorted \
                 and unique (a corrupt or foreign file)",
                i - 1
            ))),
        }
    }
    same_type(run, run).map_err(|e| Error::Snapshot(format!("{what}: {e}")))?;
    match run.data_type() {
        DataType::Int64 => {
            let v = run.as_primitive::<Int64Type>().values();
            ascending(v.len(), |i| v[i], what)
        }
        DataType::Int32 => {
            let v = run.as_primitive::<Int32Type>().values();
            ascending(v.len(), |i| v[i], what)
        }
        DataType::Utf8 => {
            let v = run.as_string::<i32>();
            ascending(v.len(), |i| v.value(i).as_bytes(), what)
        }
        DataType::LargeUtf8 => {
            let v = run.as_string::<i64>();
            ascending(v.len(), |i| v.value(i).as_bytes(), what)
        }
        DataType::Binary => {
            let v = run.as_binary::<i32>();
            ascending(v.len(), |i| v.value(i), what)
        }
        DataType::LargeBinary => {
            let v = run.as_binary::<i64>();
            ascending(v.len(), |i| v.value(i), what)
        }
        _ => unreachable!("KeyType::new admits only key types"),
    }
}

/// The filter hash ([`super::hash`]) of every key of `keys`.
pub fn hashes(keys: &dyn Array) -> Result<Vec<u64>> {
    same_type(keys, keys)?;
    Ok(match keys.data_type() {
        DataType::Int64 => keys
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .map(|&k| hash_int(k))
            .collect(),
        DataType::Int32 => keys
            .as_primitive::<Int32Type>()
            .values()
            .iter()
            .map(|&k| hash_int(k.into()))
            .collect(),
        DataType::Utf8 => {
            let v = keys.as_string::<i32>();
            (0..v.len())
                .map(|i| hash_bytes(v.value(i).as_bytes()))
                .collect()
        }
        DataType::LargeUtf8 => {
            let v = keys.as_string::<i64>();
            (0..v.len())
                .map(|i| hash_bytes(v.value(i).as_bytes()))
                .collect()
        }
        DataType::Binary => {
            let v = keys.as_binary::<i32>();
            (0..v.len()).map(|i| hash_bytes(v.value(i))).collect()
        }
        DataType::LargeBinary => {
            let v = keys.as_binary::<i64>();
            (0..v.len()).map(|i| hash_bytes(v.value(i))).collect()
        }
        _ => unreachable!("KeyType::new admits only key types"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, Float64Array, Int32Array, Int64Array, StringArray};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn finds_present_keys_in_any_probe_order() {
        let run = Int64Array::from(vec![-5, 0, 3, 9, 40, 41, 1000]);
        let probes = Int64Array::from(vec![41, -6, 3, 3, 1001, -5, 10, 1000]);
        let found = find(&run, &probes).unwrap();
        let want = [
            Some(5),
            None,
            Some(2),
            Some(2),
            None,
            Some(0),
            None,
            Some(6),
        ];
        assert_eq!(found, want);
    }

    #[test]
    fn strings_compare_as_bytes() {
        let run = StringArray::from(vec!["", "Z", "a", "ab", "é"]);
        let probes = StringArray::from(vec!["é", "ab", "b", ""]);
        assert_eq!(
            find(&run, &probes).unwrap(),
            [Some(4), Some(3), None, Some(0)]
        );
        check_sorted(&run, "r").unwrap();
    }

    #[test]
    fn bad_runs_and_probes_are_refused() {
        let err = check_sorted(&Int64Array::from(vec![1, 3, 3]), "run-7.arrow").unwrap_err();
        assert!(
            err.to_string()
                .contains("run-7.arrow: keys 1 and 2 are out of order"),
            "{err}"
        );
        let err = check_sorted(&Int32Array::from(vec![2, 1]), "r").unwrap_err();
        assert!(err.to_string().contains("keys 0 and 1"), "{err}");
        let err = find(&Int64Array::from(vec![1]), &Int32Array::from(vec![1])).unwrap_err();
        assert!(err
            .to_string()
            .contains("type Int32 looked up in a run whose keys are Int64"));
        let err = find(
            &Int64Array::from(vec![1]),
            &Int64Array::from(vec![Some(1), None]),
        );
        assert!(err.unwrap_err().to_string().contains("1 null key(s)"));
        let floats = Float64Array::from(vec![1.0]);
        assert!(find(&floats, &floats)
            .unwrap_err()
            .to_string()
            .contains("Float64"));
        assert!(check_sorted(&floats, "r").is_err());
        assert!(hashes(&floats).is_err());
    }

    #[test]
    fn an_int32_key_hashes_as_its_int64() {
        let narrow = hashes(&Int32Array::from(vec![-3, 7])).unwrap();
        assert_eq!(narrow, hashes(&Int64Array::from(vec![-3, 7])).unwrap());
    }

    proptest! {
        #[test]
        fn agrees_with_a_set_model_for_int_keys(
            run in prop::collection::btree_set(-1000i64..1000, 0..300),
            probes in prop::collection::vec(-1100i64..1100, 0..300),
        ) {
            let column: Vec<i64> = run.iter().copied().collect();
            let found = find(&Int64Array::from(column.clone()), &Int64Array::from(probes.clone()))
                .unwrap();
            for (p, at) in probes.iter().zip(found) {
                prop_assert_eq!(at, column.binary_search(p).ok().map(|i| i as u32));
            }
        }

        #[test]
        fn agrees_with_a_set_model_for_byte_keys(
            run in prop::collection::btree_set(prop::collection::vec(0u8..4, 0..4), 0..100),
            probes in prop::collection::vec(prop::collection::vec(0u8..4, 0..4), 0..100),
        ) {
            let column: Vec<Vec<u8>> = run.iter().cloned().collect();
            let array = BinaryArray::from_iter_values(column.iter());
            check_sorted(&array, "r").unwrap();
            let found = find(&array, &BinaryArray::from_iter_values(probes.iter())).unwrap();
            let set: BTreeSet<&Vec<u8>> = column.iter().collect();
            for (p, at) in probes.iter().zip(found) {
                prop_assert_eq!(at.is_some(), set.contains(p));
                if let Some(i) = at {
                    prop_assert_eq!(&column[i as usize], p);
                }
            }
        }
    }
}
