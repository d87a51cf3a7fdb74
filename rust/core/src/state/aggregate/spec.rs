//! Aggregate specs (`func(column) AS output`) and their validation against
//! an input schema: what each aggregate reads, keeps and emits.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use arrow_schema::{DataType, Field, Schema};

use crate::error::{Error, Result};
use crate::state::column::{check_supported, SUPPORTED_TYPES};
use crate::state::table::column_names;

/// An aggregate function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AggFunc {
    /// Non-null values of the column, or rows when the column is `None`
    /// (`count(*)`); `int64`.
    Count,
    /// `int64` for integer columns, `float64` for float columns; null while
    /// every value seen was null.
    Sum,
    Min,
    Max,
    /// `float64`.
    Mean,
    /// The first non-null value, in arrival order.
    First,
    /// The last non-null value, in arrival order.
    Last,
}

impl AggFunc {
    pub const ALL: [AggFunc; 7] = [
        AggFunc::Count,
        AggFunc::Sum,
        AggFunc::Min,
        AggFunc::Max,
        AggFunc::Mean,
        AggFunc::First,
        AggFunc::Last,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AggFunc::Count => "count",
            AggFunc::Sum => "sum",
            AggFunc::Min => "min",
            AggFunc::Max => "max",
            AggFunc::Mean => "mean",
            AggFunc::First => "first",
            AggFunc::Last => "last",
        }
    }
}

impl fmt::Display for AggFunc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AggFunc {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|f| f.name()).collect();
                Error::Config(format!(
                    "unknown aggregate function {s:?}; use one of: {}",
                    names.join(", ")
                ))
            })
    }
}

/// `func(column) AS output`; `column` is `None` only for `count(*)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AggSpec {
    pub func: AggFunc,
    pub column: Option<String>,
    pub output: String,
}

impl AggSpec {
    pub fn new(func: AggFunc, column: impl Into<String>, output: impl Into<String>) -> Self {
        Self {
            func,
            column: Some(column.into()),
            output: output.into(),
        }
    }
    /// `count(*) AS output`: rows per key.
    pub fn count_rows(output: impl Into<String>) -> Self {
        Self {
            func: AggFunc::Count,
            column: None,
            output: output.into(),
        }
    }
    pub fn count(column: impl Into<String>, output: impl Into<String>) -> Self {
        Self::new(AggFunc::Count, column, output)
    }
    pub fn sum(column: impl Into<String>, output: impl Into<String>) -> Self {
        Self::new(AggFunc::Sum, column, output)
    }
    pub fn min(column: impl Into<String>, output: impl Into<String>) -> Self {
        Self::new(AggFunc::Min, column, output)
    }
    pub fn max(column: impl Into<String>, output: impl Into<String>) -> Self {
        Self::new(AggFunc::Max, column, output)
    }
    pub fn mean(column: impl Into<String>, output: impl Into<String>) -> Self {
        Self::new(AggFunc::Mean, column, output)
    }
    pub fn first(column: impl Into<String>, output: impl Into<String>) -> Self {
        Self::new(AggFunc::First, column, output)
    }
    pub fn last(column: impl Into<String>, output: impl Into<String>) -> Self {
        Self::new(AggFunc::Last, column, output)
    }
}

impl fmt::Display for AggSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let column = self.column.as_deref().unwrap_or("*");
        write!(f, "{}({column}) AS {}", self.func, self.output)
    }
}

/// Suffixes of a mean's two state columns.
pub(crate) const MEAN_SUM: &str = "__sum";
pub(crate) const MEAN_COUNT: &str = "__count";

/// One validated spec and the columns it keeps and emits.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) spec: AggSpec,
    /// Its state columns (two for mean: sum, count).
    pub(crate) state: Vec<Field>,
    /// Its output column.
    pub(crate) output: Field,
}

fn is_int(t: &DataType) -> bool {
    use DataType as D;
    matches!(
        t,
        D::Int8 | D::Int16 | D::Int32 | D::Int64 | D::UInt8 | D::UInt16 | D::UInt32 | D::UInt64
    )
}

pub(crate) fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float32 | DataType::Float64)
}

impl Plan {
    fn new(schema: &Schema, spec: &AggSpec) -> Result<Self> {
        let AggSpec { func, output, .. } = spec;
        let input_type = match &spec.column {
            None if *func == AggFunc::Count => DataType::Null,
            None => {
                return Err(Error::Config(format!(
                    "aggregate {spec}: {func} needs a column; only count may have none (count(*))"
                )))
            }
            Some(c) => {
                let i = schema.index_of(c).map_err(|_| {
                    Error::Config(format!(
                        "aggregate {spec}: column '{c}' is not in the input schema (columns: {})",
                        column_names(schema)
                    ))
                })?;
                schema.field(i).data_type().clone()
            }
        };
        let t = &input_type;
        let numeric = || {
            if is_int(t) || is_float(t) {
                Ok(())
            } else {
                Err(Error::Config(format!(
                    "aggregate {spec}: column has type {t}; {func} needs a numeric column \
                     (Int8..Int64, UInt8..UInt64, Float32, Float64): cast it first"
                )))
            }
        };
        // The state keeps integer sums as Int64 so that they stay exact.
        let sum_type = if is_float(t) {
            DataType::Float64
        } else {
            DataType::Int64
        };
        let (state, out_type, out_nullable) = match func {
            AggFunc::Count => (
                vec![Field::new(output, DataType::Int64, false)],
                DataType::Int64,
                false,
            ),
            AggFunc::Sum => {
                numeric()?;
                (
                    vec![Field::new(output, sum_type.clone(), true)],
                    sum_type,
                    true,
                )
            }
            AggFunc::Mean => {
                numeric()?;
                (
                    vec![
                        Field::new(format!("{output}{MEAN_SUM}"), sum_type, false),
                        Field::new(format!("{output}{MEAN_COUNT}"), DataType::Int64, false),
                    ],
                    DataType::Float64,
                    true,
                )
            }
            AggFunc::Min | AggFunc::Max | AggFunc::First | AggFunc::Last => {
                check_supported(output, t).map_err(|_| {
                    Error::Config(format!(
                        "aggregate {spec}: column has type {t}; {func} keeps a value of the \
                         column's type, which must be one of: {SUPPORTED_TYPES}"
                    ))
                })?;
                (vec![Field::new(output, t.clone(), true)], t.clone(), true)
            }
        };
        Ok(Self {
            spec: spec.clone(),
            state,
            output: Field::new(output, out_type, out_nullable),
        })
    }
}

/// Validates `specs` against `schema` keyed by `key`: every column present
/// and of a type its function takes; output names unique, not the key and
/// not starting with `__` (reserved for state columns), and no two state
/// columns with one name.
pub(crate) fn plan(schema: &Schema, key: &str, specs: &[AggSpec]) -> Result<Vec<Plan>> {
    if specs.is_empty() {
        return Err(Error::Config(
            "keyed aggregates need at least one aggregate".into(),
        ));
    }
    let mut outputs = HashSet::new();
    for spec in specs {
        let out = spec.output.as_str();
        if out.is_empty() || out.starts_with("__") {
            return Err(Error::Config(format!(
                "aggregate {spec}: output name {out:?} is empty or starts with '__' \
                 (reserved for state columns); rename it"
            )));
        }
        if out == key || !outputs.insert(out) {
            return Err(Error::Config(format!(
                "aggregate {spec}: output name {out:?} is used twice or equals the key \
                 column '{key}'; give each aggregate a distinct name"
            )));
        }
    }
    let plans = specs
        .iter()
        .map(|spec| Plan::new(schema, spec))
        .collect::<Result<Vec<_>>>()?;
    let mut state_names: HashSet<&str> = HashSet::from([key]);
    for plan in &plans {
        for f in &plan.state {
            if !state_names.insert(f.name()) {
                return Err(Error::Config(format!(
                    "aggregate {}: its state column '{}' clashes with another column (a mean \
                     named m keeps m{MEAN_SUM} and m{MEAN_COUNT}); rename one of them",
                    plan.spec,
                    f.name()
                )));
            }
        }
    }
    Ok(plans)
}
