//! Vectorised keyed built-in aggregates whose accumulators live in a
//! [`StateTable`], for stateful steps that see one batch at a time (a Spark
//! task's micro-batch of one partition, say) and keep state between them.
//!
//! [`KeyedAggregates::apply`] groups a batch by key in one hash pass, folds
//! each group's rows into that key's state row (read with
//! [`StateTable::lookup`]) and upserts the touched keys' rows in one
//! [`StateTable::upsert`], so the table's change tracking makes the next
//! checkpoint a diff of exactly those keys.
//!
//! Semantics follow Spark's: nulls in value columns are skipped (`count(c)`
//! counts non-null values, `count(*)` rows); a sum or min/max/first/last
//! stays null while every value seen was null; min/max put NaN above every
//! number; `first`/`last` are the first/last non-null value in arrival
//! order (Spark's `first(c, ignorenulls=true)`). Integer sums (and a mean's
//! sum) are exact Int64 and fail on overflow rather than wrap.
//!
//! The state keeps exact, readable accumulators: `count`, `sum`, `min`,
//! `max`, `first`, `last` as one column named like the output (count Int64;
//! sum Int64 for integer input, Float64 for float input; the others of the
//! input's type); `mean` as `<out>__sum` (like sum) and `<out>__count`
//! (Int64). [`KeyedAggregates::output`] turns state rows into results.

mod kernels;
mod spec;

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{Array, ArrayRef, Float64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

pub use spec::{AggFunc, AggSpec};

use self::spec::{plan, Plan};
use super::group::group_rows;
use super::key::KeyType;
use super::table::{column_names, StateTable, KEY_METADATA};
use crate::error::{Error, Result};

/// Keyed built-in aggregates over batches of `input_schema`, grouped by one
/// key column, with accumulators kept in a [`StateTable`] of
/// [`Self::state_schema`].
#[derive(Clone, Debug)]
pub struct KeyedAggregates {
    input_schema: SchemaRef,
    key: String,
    plans: Vec<Plan>,
    state_schema: SchemaRef,
    output_schema: SchemaRef,
}

impl KeyedAggregates {
    /// Aggregates `specs` of batches of `input_schema`, grouped by `key`.
    /// Fails with [`Error::Config`] if the key is missing or not a state
    /// key type, a column is missing or of a type its function cannot
    /// take, or output names clash (with each other, the key, or the
    /// `__`-prefixed names reserved for state columns).
    pub fn new(input_schema: &Schema, key: &str, specs: Vec<AggSpec>) -> Result<Self> {
        let key_field = input_schema.field_with_name(key).map_err(|_| {
            Error::Config(format!(
                "key column '{key}' is not in the input schema (columns: {})",
                column_names(input_schema)
            ))
        })?;
        KeyType::new(key, key_field.data_type()).map_err(|_| {
            Error::Config(format!(
                "key column '{key}' has type {}; a state key must be Int64, Int32, Utf8, \
                 LargeUtf8, Binary or LargeBinary (for several key columns or another type, \
                 make one Binary key with encode_keys)",
                key_field.data_type()
            ))
        })?;
        let plans = plan(input_schema, key, &specs)?;
        let key_field = Field::new(key, key_field.data_type().clone(), false);
        let metadata = [(KEY_METADATA.to_string(), key.to_string())].into();
        let state_fields = std::iter::once(key_field.clone())
            .chain(plans.iter().flat_map(|p| p.state.iter().cloned()))
            .collect::<Vec<_>>();
        let output_fields = std::iter::once(key_field)
            .chain(plans.iter().map(|p| p.output.clone()))
            .collect::<Vec<_>>();
        Ok(Self {
            input_schema: Arc::new(input_schema.clone()),
            key: key.to_string(),
            plans,
            state_schema: Arc::new(Schema::new_with_metadata(state_fields, metadata)),
            output_schema: Arc::new(Schema::new(output_fields)),
        })
    }

    /// Key column plus accumulator columns; its metadata names the key, so
    /// `StateTable::new(state_schema, key, ..)` has exactly this schema.
    pub fn state_schema(&self) -> SchemaRef {
        self.state_schema.clone()
    }

    /// Key column plus one column per spec, named by its output.
    pub fn output_schema(&self) -> SchemaRef {
        self.output_schema.clone()
    }

    pub fn input_schema(&self) -> SchemaRef {
        self.input_schema.clone()
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn specs(&self) -> impl Iterator<Item = &AggSpec> {
        self.plans.iter().map(|p| &p.spec)
    }

    /// Folds `batch` (with at least the key and aggregated columns of the
    /// input schema, matched by name) into `table` and returns the merged
    /// state rows of the keys it touched: one per distinct key, in order of
    /// first appearance in the batch. On error the table is unchanged.
    pub fn apply(&self, table: &mut StateTable, batch: &RecordBatch) -> Result<RecordBatch> {
        self.check_table(table)?;
        let keys = self.input_column(batch, &self.key)?;
        if keys.null_count() > 0 {
            return Err(Error::Config(format!(
                "key column '{}' holds {} null(s); state keys must be non-null: filter or fill \
                 them before the stateful step",
                self.key,
                keys.null_count()
            )));
        }
        let inputs = self
            .plans
            .iter()
            .map(|p| {
                p.spec
                    .column
                    .as_deref()
                    .map(|c| self.input_column(batch, c))
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        if batch.num_rows() == 0 {
            return Ok(RecordBatch::new_empty(self.state_schema.clone()));
        }
        let groups = group_rows(keys.as_ref());
        let distinct = arrow_select::take::take(keys.as_ref(), &groups.first_rows(), None)
            .map_err(internal)?;
        let (state, present) = table.lookup(distinct.as_ref())?;
        let mut columns: Vec<ArrayRef> = vec![distinct];
        let mut next = 1;
        for (plan, input) in self.plans.iter().zip(&inputs) {
            let n = plan.state.len();
            let current = &state.columns()[next..next + n];
            columns.extend(kernels::merge(plan, &groups, input.as_deref(), current)?);
            next += n;
        }
        let merged = RecordBatch::try_new(self.state_schema.clone(), columns).map_err(internal)?;
        // The keys are distinct and just looked up: the runs are not searched twice.
        table.upsert_looked_up(&merged, &present)?;
        Ok(merged)
    }

    /// Output rows (key plus one column per spec; a mean is sum / count,
    /// null when the count is 0) of state rows such as [`Self::apply`]
    /// returns or the table holds. Columns are matched by name.
    pub fn output(&self, state_rows: &RecordBatch) -> Result<RecordBatch> {
        let column = |f: &Field| -> Result<ArrayRef> {
            let c = state_rows.column_by_name(f.name()).ok_or_else(|| {
                Error::Config(format!(
                    "state rows have no column '{}' (columns: {}; state schema: {})",
                    f.name(),
                    column_names(state_rows.schema_ref()),
                    column_names(&self.state_schema)
                ))
            })?;
            if c.data_type() != f.data_type() {
                return Err(Error::Config(format!(
                    "state column '{}' has type {}, the state schema says {}",
                    f.name(),
                    c.data_type(),
                    f.data_type()
                )));
            }
            if !f.is_nullable() && c.null_count() > 0 {
                return Err(Error::Config(format!(
                    "state column '{}' holds {} null(s); pass rows of keys present in the \
                     table (e.g. lookup's rows filtered by its present mask)",
                    f.name(),
                    c.null_count()
                )));
            }
            Ok(c.clone())
        };
        let mut columns = vec![column(self.state_schema.field(0))?];
        for plan in &self.plans {
            let state = plan.state.iter().map(column).collect::<Result<Vec<_>>>()?;
            columns.push(match plan.spec.func {
                AggFunc::Mean => mean(&state[0], &state[1]),
                _ => state[0].clone(),
            });
        }
        RecordBatch::try_new(self.output_schema.clone(), columns).map_err(internal)
    }

    fn check_table(&self, table: &StateTable) -> Result<()> {
        let schema = table.schema();
        if table.key_column() != self.key || schema.fields() != self.state_schema.fields() {
            return Err(Error::Config(format!(
                "the state table (key '{}', columns: {}) was not made for these aggregates \
                 (key '{}', columns: {}); create it from their state_schema",
                table.key_column(),
                describe(&schema),
                self.key,
                describe(&self.state_schema)
            )));
        }
        Ok(())
    }

    /// Batch column `name`, checked against the input schema's type.
    fn input_column(&self, batch: &RecordBatch, name: &str) -> Result<ArrayRef> {
        let want = self
            .input_schema
            .field_with_name(name)
            .expect("planned columns are in the input schema")
            .data_type();
        let c = batch.column_by_name(name).ok_or_else(|| {
            Error::Config(format!(
                "batch has no column '{name}' (batch columns: {})",
                column_names(batch.schema_ref())
            ))
        })?;
        if c.data_type() != want {
            return Err(Error::Config(format!(
                "batch column '{name}' has type {}, the aggregates' input schema says {want}; \
                 cast it first",
                c.data_type()
            )));
        }
        Ok(c.clone())
    }
}

fn describe(schema: &Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| {
            let null = if f.is_nullable() { "" } else { " not null" };
            format!("{} {}{null}", f.name(), f.data_type())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn mean(sum: &ArrayRef, count: &ArrayRef) -> ArrayRef {
    let count = count.as_primitive::<Int64Type>();
    let at = |i: usize| (count.is_valid(i) && count.value(i) > 0).then(|| count.value(i) as f64);
    let out: Float64Array = match sum.data_type() {
        DataType::Float64 => {
            let s = sum.as_primitive::<Float64Type>();
            (0..s.len())
                .map(|i| Some(s.value(i) / at(i)?).filter(|_| s.is_valid(i)))
                .collect()
        }
        _ => {
            let s = sum.as_primitive::<Int64Type>();
            (0..s.len())
                .map(|i| Some(s.value(i) as f64 / at(i)?).filter(|_| s.is_valid(i)))
                .collect()
        }
    };
    Arc::new(out)
}

fn internal(e: arrow_schema::ArrowError) -> Error {
    Error::Task(format!("keyed aggregates: {e}"))
}

#[cfg(test)]
mod tests;
