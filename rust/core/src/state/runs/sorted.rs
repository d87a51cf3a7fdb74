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

/// Rows between two fences of a run's integer key column
/// ([`Fences`]): a block of 64 `i64` keys is 512 bytes, eight cache lines.
pub const FENCE_STEP: usize = 64;

/// Runs shorter than this are searched without fences: their key column is
/// small enough to stay in cache.
const FENCED_FROM: usize = 16 * FENCE_STEP;

/// Every [`FENCE_STEP`]-th key of a long run's integer key column (row 0,
/// 64, 128, ...), so that a batch's search gallops through a copy 64 times
/// smaller than the column (it stays in cache: 1.25 MB for 10M keys) and
/// reads the column itself only in the one block of 64 keys that can hold
/// the probe. A galloping search over the column reads a new cache line at
/// nearly every step once the probes are far apart (a batch of thousands of
/// keys against a run of millions), which made the search most of a
/// budgeted table's lookups.
#[derive(Clone, Debug)]
pub struct Fences(Vec<i64>);

impl Fences {
    /// `None` for byte keys and runs shorter than [`FENCED_FROM`] rows.
    pub fn of(run: &dyn Array) -> Option<Self> {
        if run.len() < FENCED_FROM || run.null_count() > 0 {
            return None;
        }
        match run.data_type() {
            DataType::Int64 => {
                let v = run.as_primitive::<Int64Type>().values();
                Some(Self(v.iter().step_by(FENCE_STEP).copied().collect()))
            }
            DataType::Int32 => {
                let v = run.as_primitive::<Int32Type>().values();
                Some(Self(
                    v.iter().step_by(FENCE_STEP).map(|&k| k.into()).collect(),
                ))
            }
            _ => None,
        }
    }

    pub fn len_bytes(&self) -> usize {
        self.0.len() * std::mem::size_of::<i64>()
    }
}

fn find_fenced_with(
    run_len: usize,
    run_at: impl Fn(usize) -> i64,
    fences: &[i64],
    probe_len: usize,
    probe_at: impl Fn(usize) -> i64,
) -> Vec<Option<u32>> {
    let mut order: Vec<u32> = (0..probe_len as u32).collect();
    order.sort_unstable_by_key(|&i| probe_at(i as usize));
    let mut found = vec![None; probe_len];
    let mut fence = 0;
    for p in order {
        let key = probe_at(p as usize);
        // The first fence not below the key: the key's place is after the
        // fence before it and at most at this fence's row.
        fence = lower_bound(fences.len(), &|i| fences[i], fence, &key);
        let low = fence.saturating_sub(1) * FENCE_STEP;
        let high = (fence * FENCE_STEP + 1).min(run_len);
        let row = lower_bound(high, &run_at, low, &key);
        if row < run_len && run_at(row) == key {
            found[p as usize] = Some(row as u32);
        }
    }
    found
}

/// [`find`] over a run with [`Fences`] (made of this `run`).
pub fn find_fenced(
    run: &dyn Array,
    fences: &Fences,
    probes: &dyn Array,
) -> Result<Vec<Option<u32>>> {
    same_type(run, probes)?;
    Ok(match run.data_type() {
        DataType::Int64 => {
            let (r, p) = (
                run.as_primitive::<Int64Type>().values(),
                probes.as_primitive::<Int64Type>().values(),
            );
            find_fenced_with(r.len(), |i| r[i], &fences.0, p.len(), |i| p[i])
        }
        DataType::Int32 => {
            let (r, p) = (
                run.as_primitive::<Int32Type>().values(),
                probes.as_primitive::<Int32Type>().values(),
            );
            find_fenced_with(
                r.len(),
                |i| r[i].into(),
                &fences.0,
                p.len(),
                |i| p[i].into(),
            )
        }
        _ => return find(run, probes),
    })
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
    use arrow_array::{ArrayRef, BinaryArray, Float64Array, Int32Array, Int64Array, StringArray};
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use std::sync::Arc;

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
    fn short_runs_and_byte_keys_have_no_fences() {
        assert!(Fences::of(&Int64Array::from((0..1023).collect::<Vec<i64>>())).is_none());
        let long = Int64Array::from((0..1024).collect::<Vec<i64>>());
        assert_eq!(Fences::of(&long).unwrap().len_bytes(), 16 * 8);
        let names: Vec<String> = (0..2000).map(|i| format!("{i:05}")).collect();
        assert!(Fences::of(&StringArray::from(names)).is_none());
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
        fn a_fenced_search_agrees_with_a_set_model(
            run in prop::collection::btree_set(-40_000i64..40_000, 1024..6000),
            probes in prop::collection::vec(-41_000i64..41_000, 0..400),
            narrow in any::<bool>(),
        ) {
            // Probes on and around every fence and the run's ends as well.
            let column: Vec<i64> = run.iter().copied().collect();
            let mut probes = probes;
            for row in (0..column.len()).step_by(FENCE_STEP).chain([column.len() - 1]) {
                probes.extend([column[row] - 1, column[row], column[row] + 1]);
            }
            let (run_array, probe_array): (ArrayRef, ArrayRef) = if narrow {
                let n = |v: &[i64]| -> ArrayRef {
                    Arc::new(Int32Array::from(v.iter().map(|&k| k as i32).collect::<Vec<_>>()))
                };
                (n(&column), n(&probes))
            } else {
                (Arc::new(Int64Array::from(column.clone())), Arc::new(Int64Array::from(probes.clone())))
            };
            let fences = Fences::of(run_array.as_ref()).expect("a run of 1,024 keys or more");
            let found = find_fenced(run_array.as_ref(), &fences, probe_array.as_ref()).unwrap();
            for (p, at) in probes.iter().zip(found) {
                prop_assert_eq!(at, column.binary_search(p).ok().map(|i| i as u32), "probe {}", p);
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
