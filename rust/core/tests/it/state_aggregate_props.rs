//! KeyedAggregates vs a BTreeMap model folded row by row: random batches
//! (Int64 or Utf8 keys, nulls everywhere), checkpoints in between. After each
//! batch the table, the returned rows and the outputs equal the model; each
//! diff holds exactly the keys touched since the previous checkpoint; and
//! restoring the last chain gives the model at that checkpoint.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use proptest::prelude::*;
use snapcut_core::snapshot::{StateCapture, StateKind};
use snapcut_core::state::{AggSpec, KeyedAggregates, StatePolicy, StateTable, DELETED_COLUMN};

type Row = (i64, Option<i64>, Option<f64>, Option<String>);

#[derive(Clone, Debug)]
enum Op {
    Apply(Vec<Row>),
    Checkpoint,
}

fn specs() -> Vec<AggSpec> {
    vec![
        AggSpec::count_rows("rows"),
        AggSpec::count("s", "n_s"),
        AggSpec::sum("v", "sum_v"),
        AggSpec::sum("f", "sum_f"),
        AggSpec::min("v", "min_v"),
        AggSpec::max("v", "max_v"),
        AggSpec::min("f", "min_f"),
        AggSpec::max("s", "max_s"),
        AggSpec::min("s", "min_s"),
        AggSpec::first("v", "first_v"),
        AggSpec::last("v", "last_v"),
        AggSpec::first("s", "first_s"),
        AggSpec::last("f", "last_f"),
        AggSpec::mean("v", "avg_v"),
        AggSpec::mean("f", "avg_f"),
    ]
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Acc {
    rows: i64,
    n_s: i64,
    sum_v: Option<i64>,
    sum_f: Option<f64>,
    min_v: Option<i64>,
    max_v: Option<i64>,
    min_f: Option<f64>,
    max_s: Option<String>,
    min_s: Option<String>,
    first_v: Option<i64>,
    last_v: Option<i64>,
    first_s: Option<String>,
    last_f: Option<f64>,
    n_v: i64,
    n_f: i64,
}

impl Acc {
    fn add(&mut self, (_, v, f, s): &Row) {
        self.rows += 1;
        if let Some(v) = *v {
            self.n_v += 1;
            self.sum_v = Some(self.sum_v.unwrap_or(0) + v);
            self.min_v = Some(self.min_v.map_or(v, |m| m.min(v)));
            self.max_v = Some(self.max_v.map_or(v, |m| m.max(v)));
            self.first_v = self.first_v.or(Some(v));
            self.last_v = Some(v);
        }
        if let Some(f) = *f {
            self.n_f += 1;
            self.sum_f = Some(self.sum_f.unwrap_or(0.0) + f);
            self.min_f = Some(self.min_f.map_or(f, |m| m.min(f)));
            self.last_f = Some(f);
        }
        if let Some(s) = s {
            self.n_s += 1;
            self.max_s = Some(self.max_s.take().map_or(s.clone(), |m| m.max(s.clone())));
            self.min_s = Some(self.min_s.take().map_or(s.clone(), |m| m.min(s.clone())));
            self.first_s = self.first_s.take().or(Some(s.clone()));
        }
    }

    /// The state row's cells after the key, in state-schema order.
    fn state(&self) -> Vec<String> {
        let i = |v: Option<i64>| v.map_or("null".into(), |v| v.to_string());
        let f = |v: Option<f64>| v.map_or("null".into(), |v| format!("{v:?}"));
        let s = |v: &Option<String>| v.clone().unwrap_or("null".into());
        vec![
            self.rows.to_string(),
            self.n_s.to_string(),
            i(self.sum_v),
            f(self.sum_f),
            i(self.min_v),
            i(self.max_v),
            f(self.min_f),
            s(&self.max_s),
            s(&self.min_s),
            i(self.first_v),
            i(self.last_v),
            s(&self.first_s),
            f(self.last_f),
            self.sum_v.unwrap_or(0).to_string(),
            self.n_v.to_string(),
            format!("{:?}", self.sum_f.unwrap_or(0.0)),
            self.n_f.to_string(),
        ]
    }

    fn means(&self) -> (Option<f64>, Option<f64>) {
        let v = (self.n_v > 0).then(|| self.sum_v.unwrap() as f64 / self.n_v as f64);
        let f = (self.n_f > 0).then(|| self.sum_f.unwrap() / self.n_f as f64);
        (v, f)
    }
}

type Model = BTreeMap<i64, Acc>;

fn input_schema(str_keys: bool) -> Arc<Schema> {
    let key = if str_keys {
        DataType::Utf8
    } else {
        DataType::Int64
    };
    Arc::new(Schema::new(vec![
        Field::new("k", key, false),
        Field::new("v", DataType::Int64, true),
        Field::new("f", DataType::Float64, true),
        Field::new("s", DataType::Utf8, true),
    ]))
}

fn batch(rows: &[Row], str_keys: bool) -> RecordBatch {
    let keys: ArrayRef = if str_keys {
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| format!("k{}", r.0)),
        ))
    } else {
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0)))
    };
    RecordBatch::try_new(
        input_schema(str_keys),
        vec![
            keys,
            Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1))),
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.2))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.3.clone()))),
        ],
    )
    .unwrap()
}

fn key_of(a: &dyn Array, i: usize) -> i64 {
    match a.data_type() {
        DataType::Utf8 => a.as_string::<i32>().value(i)[1..].parse().unwrap(),
        _ => a.as_primitive::<Int64Type>().value(i),
    }
}

fn cell(a: &dyn Array, i: usize) -> String {
    if a.is_null(i) {
        return "null".into();
    }
    match a.data_type() {
        DataType::Int64 => a.as_primitive::<Int64Type>().value(i).to_string(),
        DataType::Float64 => format!("{:?}", a.as_primitive::<Float64Type>().value(i)),
        DataType::Utf8 => a.as_string::<i32>().value(i).to_string(),
        other => panic!("no cell format for {other}"),
    }
}

/// (key, cells after the key) of every row, in row order.
fn rows_of(b: &RecordBatch) -> Vec<(i64, Vec<String>)> {
    (0..b.num_rows())
        .map(|i| {
            let cells = b.columns()[1..]
                .iter()
                .map(|c| cell(c.as_ref(), i))
                .collect();
            (key_of(b.column(0).as_ref(), i), cells)
        })
        .collect()
}

fn model_rows(m: &Model) -> Vec<(i64, Vec<String>)> {
    m.iter().map(|(k, a)| (*k, a.state())).collect()
}

fn sorted(mut rows: Vec<(i64, Vec<String>)>) -> Vec<(i64, Vec<String>)> {
    rows.sort_by_key(|r| r.0);
    rows
}

fn op() -> impl Strategy<Value = Op> {
    let row = (
        0i64..25,
        proptest::option::of(-1000i64..1000),
        // Quarters are exact, so sums do not depend on association.
        proptest::option::of((-400i64..400).prop_map(|q| q as f64 / 4.0)),
        proptest::option::of("[a-c]{0,2}"),
    );
    prop_oneof![
        5 => proptest::collection::vec(row, 0..30).prop_map(Op::Apply),
        1 => Just(Op::Checkpoint),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]
    #[test]
    fn aggregates_equal_a_row_by_row_model(
        ops in proptest::collection::vec(op(), 1..25),
        str_keys in any::<bool>(),
        full_every in 1u32..4,
    ) {
        let aggs = KeyedAggregates::new(&input_schema(str_keys), "k", specs()).unwrap();
        let policy = StatePolicy { full_every };
        let mut table = StateTable::new(aggs.state_schema(), "k", policy).unwrap();
        let mut model = Model::new();
        let mut touched: BTreeSet<i64> = BTreeSet::new();
        let mut chain: Vec<(u64, StateCapture)> = Vec::new();
        let mut at_last_checkpoint = Model::new();
        let mut next_id = 1;
        for op in ops {
            match op {
                Op::Apply(rows) => {
                    let out = aggs.apply(&mut table, &batch(&rows, str_keys)).unwrap();
                    let mut order: Vec<i64> = Vec::new();
                    for r in &rows {
                        model.entry(r.0).or_default().add(r);
                        if !order.contains(&r.0) {
                            order.push(r.0);
                        }
                        touched.insert(r.0);
                    }
                    let want: Vec<_> = order.iter().map(|k| (*k, model[k].state())).collect();
                    prop_assert_eq!(rows_of(&out), want);
                    let results = aggs.output(&out).unwrap();
                    prop_assert_eq!(results.schema(), aggs.output_schema());
                    for (i, k) in order.iter().enumerate() {
                        let (v, f) = model[k].means();
                        let got = |c: &str| {
                            let a = results.column_by_name(c).unwrap().as_primitive::<Float64Type>();
                            a.is_valid(i).then(|| a.value(i))
                        };
                        prop_assert_eq!(got("avg_v"), v);
                        prop_assert_eq!(got("avg_f"), f);
                    }
                }
                Op::Checkpoint => {
                    let cap = table.checkpoint(next_id).unwrap();
                    if let StateKind::Diff { .. } = cap.kind {
                        let deleted = cap.batch.column_by_name(DELETED_COLUMN).unwrap();
                        prop_assert_eq!(deleted.as_boolean().true_count(), 0);
                        let keys: BTreeSet<i64> = (0..cap.batch.num_rows())
                            .map(|i| key_of(cap.batch.column(0).as_ref(), i))
                            .collect();
                        prop_assert_eq!(&keys, &touched);
                        chain.push((next_id, cap));
                    } else {
                        chain = vec![(next_id, cap)];
                    }
                    touched.clear();
                    at_last_checkpoint = model.clone();
                    next_id += 1;
                }
            }
            prop_assert_eq!(sorted(rows_of(&table.to_batch())), model_rows(&model));
        }
        if !chain.is_empty() {
            let mut restored = StateTable::new(aggs.state_schema(), "k", policy).unwrap();
            restored.restore(&chain).unwrap();
            prop_assert_eq!(
                sorted(rows_of(&restored.to_batch())),
                model_rows(&at_last_checkpoint)
            );
        }
    }
}
