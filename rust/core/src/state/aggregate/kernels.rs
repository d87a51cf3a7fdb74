//! Typed kernels: fold one batch column into the state rows of its groups.
//!
//! Each kernel starts from the group's state values (null/absent = nothing
//! seen yet) and folds the batch's rows in arrival order, so a result equals
//! folding every row ever seen one by one (float sums included).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayAccessor, ArrayRef, ArrowPrimitiveType, Float64Array, Int64Array};
use arrow_buffer::{ArrowNativeType, NullBuffer};
use arrow_schema::{DataType, TimeUnit};
use arrow_select::interleave::interleave;

use super::spec::{is_float, AggFunc, Plan};
use crate::error::{Error, Result};
use crate::state::group::Groups;

/// The merged state columns of `plan` for every group of `g`: `input` is the
/// batch's column (`None` for count(*)), `state` the groups' current state
/// columns (nulls for keys not in the table yet).
pub(crate) fn merge(
    plan: &Plan,
    g: &Groups,
    input: Option<&dyn Array>,
    state: &[ArrayRef],
) -> Result<Vec<ArrayRef>> {
    let func = plan.spec.func;
    let col = || input.expect("only count(*) has no input column");
    Ok(match func {
        AggFunc::Count => vec![count(g, input, state[0].as_ref())],
        AggFunc::Sum => vec![sum(plan, g, col(), state[0].as_ref(), true)?],
        AggFunc::Mean => vec![
            sum(plan, g, col(), state[0].as_ref(), false)?,
            count(g, input, state[1].as_ref()),
        ],
        AggFunc::Min | AggFunc::Max => {
            vec![min_max(g, col(), state[0].as_ref(), func == AggFunc::Max)?]
        }
        AggFunc::First | AggFunc::Last => {
            vec![first_last(
                g,
                col(),
                state[0].as_ref(),
                func == AggFunc::Last,
            )?]
        }
    })
}

/// Calls `f` with every row of `a` that is not null, stopping at an error.
fn try_for_valid<E>(a: &dyn Array, f: impl FnMut(usize) -> Result<(), E>) -> Result<(), E> {
    match a.logical_nulls() {
        None => (0..a.len()).try_for_each(f),
        Some(nulls) => nulls.valid_indices().try_for_each(f),
    }
}

fn for_valid(a: &dyn Array, mut f: impl FnMut(usize)) {
    let _ = try_for_valid::<()>(a, |i| {
        f(i);
        Ok(())
    });
}

/// An Int64 state column as values (0 where null) and validity.
fn int_state(state: &dyn Array) -> (Vec<i64>, Vec<bool>) {
    let a = state.as_primitive::<Int64Type>();
    (0..a.len())
        .map(|i| {
            if a.is_valid(i) {
                (a.value(i), true)
            } else {
                (0, false)
            }
        })
        .unzip()
}

fn float_state(state: &dyn Array) -> (Vec<f64>, Vec<bool>) {
    let a = state.as_primitive::<Float64Type>();
    (0..a.len())
        .map(|i| {
            if a.is_valid(i) {
                (a.value(i), true)
            } else {
                (0.0, false)
            }
        })
        .unzip()
}

fn count(g: &Groups, input: Option<&dyn Array>, state: &dyn Array) -> ArrayRef {
    let (mut acc, _) = int_state(state);
    match input {
        None => g.of_row.iter().for_each(|&grp| acc[grp as usize] += 1),
        Some(a) => for_valid(a, |i| acc[g.of_row[i] as usize] += 1),
    }
    Arc::new(Int64Array::from(acc))
}

/// Sum (or a mean's sum) into Int64 for integer input, exact and checked,
/// or Float64 for float input; `nullable`: null while nothing was summed.
fn sum(
    plan: &Plan,
    g: &Groups,
    input: &dyn Array,
    state: &dyn Array,
    nullable: bool,
) -> Result<ArrayRef> {
    let nulls = |seen: Vec<bool>| {
        let n = NullBuffer::from(seen);
        (nullable && n.null_count() > 0).then_some(n)
    };
    if is_float(input.data_type()) {
        let (mut acc, mut seen) = float_state(state);
        match input.data_type() {
            DataType::Float32 => sum_float::<Float32Type>(g, input, &mut acc, &mut seen),
            _ => sum_float::<Float64Type>(g, input, &mut acc, &mut seen),
        }
        return Ok(Arc::new(Float64Array::new(acc.into(), nulls(seen))));
    }
    let (mut acc, mut seen) = int_state(state);
    macro_rules! ints {
        ($($d:ident => $t:ty),*) => {
            match input.data_type() {
                $(DataType::$d => sum_int::<$t>(g, input, &mut acc, &mut seen),)*
                other => unreachable!("sum of {other} was rejected when planning"),
            }
        };
    }
    let overflow = ints!(
        Int8 => Int8Type, Int16 => Int16Type, Int32 => Int32Type, Int64 => Int64Type,
        UInt8 => UInt8Type, UInt16 => UInt16Type, UInt32 => UInt32Type, UInt64 => UInt64Type
    );
    if let Err(row) = overflow {
        return Err(Error::Task(format!(
            "aggregate {}: the exact Int64 sum of a key overflows at batch row {row}; cast \
             the column to float64 before aggregating",
            plan.spec
        )));
    }
    Ok(Arc::new(Int64Array::new(acc.into(), nulls(seen))))
}

/// Err(row) at the first row whose value does not fit the Int64 sum.
fn sum_int<T: ArrowPrimitiveType>(
    g: &Groups,
    input: &dyn Array,
    acc: &mut [i64],
    seen: &mut [bool],
) -> Result<(), usize> {
    let values = input.as_primitive::<T>().values();
    try_for_valid(input, |i| {
        let grp = g.of_row[i] as usize;
        let sum = values[i].to_i64().and_then(|v| acc[grp].checked_add(v));
        acc[grp] = sum.ok_or(i)?;
        seen[grp] = true;
        Ok(())
    })
}

fn sum_float<T: ArrowPrimitiveType>(
    g: &Groups,
    input: &dyn Array,
    acc: &mut [f64],
    seen: &mut [bool],
) where
    T::Native: Into<f64>,
{
    let values = input.as_primitive::<T>().values();
    for_valid(input, |i| {
        let grp = g.of_row[i] as usize;
        acc[grp] += values[i].into();
        seen[grp] = true;
    });
}

/// Spark's order for min/max: floats put NaN above every number and
/// compare -0.0 equal to 0.0; strings compare by UTF-8 bytes.
trait SparkOrd: Copy {
    fn lt(self, other: Self) -> bool;
}

macro_rules! spark_ord {
    ($($t:ty),*) => {
        $(impl SparkOrd for $t {
            #[inline]
            fn lt(self, other: Self) -> bool {
                self < other
            }
        })*
    };
}
spark_ord!(i8, i16, i32, i64, u8, u16, u32, u64, bool, &str, &[u8]);

macro_rules! spark_ord_float {
    ($($t:ty),*) => {
        $(impl SparkOrd for $t {
            #[inline]
            fn lt(self, other: Self) -> bool {
                !self.is_nan() && (other.is_nan() || self < other)
            }
        })*
    };
}
spark_ord_float!(f32, f64);

/// Per group, which value wins: `(0, group)` keeps the state's, `(1, row)`
/// takes the batch row's (for [`interleave`] over `[state, input]`).
fn best<A>(g: &Groups, input: A, state: A, max: bool) -> Vec<(usize, usize)>
where
    A: ArrayAccessor + Copy,
    A::Item: SparkOrd,
{
    let better = |a: A::Item, b: A::Item| if max { b.lt(a) } else { a.lt(b) };
    let mut best: Vec<Option<usize>> = vec![None; g.len()];
    for_valid(&input, |i| {
        let grp = g.of_row[i] as usize;
        match best[grp] {
            Some(b) if !better(input.value(i), input.value(b)) => {}
            _ => best[grp] = Some(i),
        }
    });
    best.into_iter()
        .enumerate()
        .map(|(grp, row)| match row {
            Some(r) if state.is_null(grp) || better(input.value(r), state.value(grp)) => (1, r),
            _ => (0, grp),
        })
        .collect()
}

fn min_max(g: &Groups, input: &dyn Array, state: &dyn Array, max: bool) -> Result<ArrayRef> {
    use DataType as D;
    use TimeUnit as U;
    macro_rules! prim {
        ($t:ty) => {
            best(
                g,
                input.as_primitive::<$t>(),
                state.as_primitive::<$t>(),
                max,
            )
        };
    }
    let picks = match input.data_type() {
        D::Boolean => best(g, input.as_boolean(), state.as_boolean(), max),
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
        D::Timestamp(U::Second, _) => prim!(TimestampSecondType),
        D::Timestamp(U::Millisecond, _) => prim!(TimestampMillisecondType),
        D::Timestamp(U::Microsecond, _) => prim!(TimestampMicrosecondType),
        D::Timestamp(U::Nanosecond, _) => prim!(TimestampNanosecondType),
        D::Duration(U::Second) => prim!(DurationSecondType),
        D::Duration(U::Millisecond) => prim!(DurationMillisecondType),
        D::Duration(U::Microsecond) => prim!(DurationMicrosecondType),
        D::Duration(U::Nanosecond) => prim!(DurationNanosecondType),
        D::Utf8 => best(g, input.as_string::<i32>(), state.as_string::<i32>(), max),
        D::LargeUtf8 => best(g, input.as_string::<i64>(), state.as_string::<i64>(), max),
        D::Binary => best(g, input.as_binary::<i32>(), state.as_binary::<i32>(), max),
        D::LargeBinary => best(g, input.as_binary::<i64>(), state.as_binary::<i64>(), max),
        other => unreachable!("min/max of {other} was rejected when planning"),
    };
    interleave(&[state, input], &picks).map_err(internal)
}

/// First: the state's value if it has one, else the group's first non-null
/// row; last: the group's last non-null row if any, else the state's.
fn first_last(g: &Groups, input: &dyn Array, state: &dyn Array, last: bool) -> Result<ArrayRef> {
    let mut pick: Vec<Option<usize>> = vec![None; g.len()];
    for_valid(input, |i| {
        let p = &mut pick[g.of_row[i] as usize];
        if last || p.is_none() {
            *p = Some(i);
        }
    });
    let picks: Vec<(usize, usize)> = pick
        .into_iter()
        .enumerate()
        .map(|(grp, row)| match row {
            Some(r) if last || state.is_null(grp) => (1, r),
            _ => (0, grp),
        })
        .collect();
    interleave(&[state, input], &picks).map_err(internal)
}

fn internal(e: arrow_schema::ArrowError) -> Error {
    Error::Task(format!("keyed aggregates: merging state failed: {e}"))
}
