//! KeyedAggregates against a naive row-at-a-time model, plus schemas,
//! change tracking and errors.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{
    Array, ArrayRef, Float32Array, Float64Array, Int64Array, RecordBatch, StringArray, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::{AggFunc, AggSpec, KeyedAggregates};
use crate::error::Error;
use crate::snapshot::StateKind;
use crate::state::{StatePolicy, StateTable, DELETED_COLUMN};

type Row = (i64, Option<i64>, Option<f64>, Option<&'static str>);

fn input_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("v", DataType::Int64, true),
        Field::new("f", DataType::Float64, true),
        Field::new("s", DataType::Utf8, true),
    ]))
}

fn batch(rows: &[Row]) -> RecordBatch {
    RecordBatch::try_new(
        input_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1))),
            Arc::new(Float64Array::from_iter(rows.iter().map(|r| r.2))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.3))),
        ],
    )
    .unwrap()
}

fn all_specs() -> Vec<AggSpec> {
    vec![
        AggSpec::count_rows("rows"),
        AggSpec::count("v", "n_v"),
        AggSpec::sum("v", "sum_v"),
        AggSpec::sum("f", "sum_f"),
        AggSpec::min("v", "min_v"),
        AggSpec::max("f", "max_f"),
        AggSpec::min("s", "min_s"),
        AggSpec::max("s", "max_s"),
        AggSpec::first("v", "first_v"),
        AggSpec::last("s", "last_s"),
        AggSpec::mean("v", "avg_v"),
        AggSpec::mean("f", "avg_f"),
    ]
}

fn setup(specs: Vec<AggSpec>) -> (KeyedAggregates, StateTable) {
    let aggs = KeyedAggregates::new(&input_schema(), "k", specs).unwrap();
    let table = StateTable::new(aggs.state_schema(), "k", StatePolicy { full_every: 100 }).unwrap();
    (aggs, table)
}

/// A cell as text, for comparing with the model.
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

/// key → every other column as text, by row.
fn rows_of(b: &RecordBatch) -> BTreeMap<i64, Vec<String>> {
    let keys = b.column(0).as_primitive::<Int64Type>();
    (0..b.num_rows())
        .map(|i| {
            let rest = b.columns()[1..]
                .iter()
                .map(|c| cell(c.as_ref(), i))
                .collect();
            (keys.value(i), rest)
        })
        .collect()
}

/// The state rows `all_specs()` must hold after `rows`, folded one by one.
fn model(rows: &[Row]) -> BTreeMap<i64, Vec<String>> {
    #[derive(Default)]
    struct Acc {
        rows: i64,
        n_v: i64,
        sum_v: Option<i64>,
        sum_f: Option<f64>,
        min_v: Option<i64>,
        max_f: Option<f64>,
        min_s: Option<&'static str>,
        max_s: Option<&'static str>,
        first_v: Option<i64>,
        last_s: Option<&'static str>,
        n_f: i64,
    }
    let mut accs: BTreeMap<i64, Acc> = BTreeMap::new();
    for &(k, v, f, s) in rows {
        let a = accs.entry(k).or_default();
        a.rows += 1;
        if let Some(v) = v {
            a.n_v += 1;
            a.sum_v = Some(a.sum_v.unwrap_or(0) + v);
            a.min_v = Some(a.min_v.map_or(v, |m| m.min(v)));
            a.first_v = a.first_v.or(Some(v));
        }
        if let Some(f) = f {
            a.n_f += 1;
            a.sum_f = Some(a.sum_f.unwrap_or(0.0) + f);
            a.max_f = Some(a.max_f.map_or(f, |m| m.max(f)));
        }
        if let Some(s) = s {
            a.min_s = Some(a.min_s.map_or(s, |m| m.min(s)));
            a.max_s = Some(a.max_s.map_or(s, |m| m.max(s)));
            a.last_s = Some(s);
        }
    }
    let t = |v: Option<String>| v.unwrap_or_else(|| "null".into());
    accs.into_iter()
        .map(|(k, a)| {
            let row = vec![
                a.rows.to_string(),
                a.n_v.to_string(),
                t(a.sum_v.map(|v| v.to_string())),
                t(a.sum_f.map(|v| format!("{v:?}"))),
                t(a.min_v.map(|v| v.to_string())),
                t(a.max_f.map(|v| format!("{v:?}"))),
                t(a.min_s.map(String::from)),
                t(a.max_s.map(String::from)),
                t(a.first_v.map(|v| v.to_string())),
                t(a.last_s.map(String::from)),
                a.sum_v.unwrap_or(0).to_string(),
                a.n_v.to_string(),
                format!("{:?}", a.sum_f.unwrap_or(0.0)),
                a.n_f.to_string(),
            ];
            (k, row)
        })
        .collect()
}

fn batches() -> Vec<Vec<Row>> {
    vec![
        vec![
            (1, Some(5), Some(1.5), Some("m")),
            (2, None, None, None),
            (1, Some(-3), None, Some("b")),
            (3, Some(7), Some(-2.0), None),
        ],
        vec![
            (2, None, Some(0.25), Some("z")),
            (4, Some(1), None, Some("a")),
        ],
        vec![],
        vec![
            (1, None, Some(10.0), Some("c")),
            (2, Some(8), None, None),
            (2, Some(9), Some(1.0), Some("y")),
            (5, None, None, None),
        ],
    ]
}

#[test]
fn state_matches_a_row_by_row_model_over_several_batches() {
    let (aggs, mut table) = setup(all_specs());
    let mut seen: Vec<Row> = Vec::new();
    for rows in batches() {
        let touched = aggs.apply(&mut table, &batch(&rows)).unwrap();
        seen.extend(&rows);
        let want = model(&seen);
        assert_eq!(rows_of(&table.to_batch()), want);
        // The returned rows are the touched keys' merged state.
        let got = rows_of(&touched);
        assert_eq!(got.len(), touched.num_rows(), "one row per distinct key");
        for (k, row) in got {
            assert_eq!(row, want[&k], "key {k}");
        }
    }
}

#[test]
fn apply_returns_touched_keys_in_order_of_first_appearance() {
    let (aggs, mut table) = setup(vec![AggSpec::count_rows("n")]);
    aggs.apply(&mut table, &batch(&[(1, None, None, None)]))
        .unwrap();
    let rows = [7, 1, 7, 3, 1].map(|k| (k, None, None, None));
    let out = aggs.apply(&mut table, &batch(&rows)).unwrap();
    let keys: Vec<i64> = out.column(0).as_primitive::<Int64Type>().values().to_vec();
    assert_eq!(keys, vec![7, 1, 3]);
    let n: Vec<i64> = out.column(1).as_primitive::<Int64Type>().values().to_vec();
    assert_eq!(n, vec![2, 3, 1]);
    assert_eq!(out.schema(), aggs.state_schema());
}

#[test]
fn schemas_name_and_type_the_accumulators() {
    let aggs = KeyedAggregates::new(&input_schema(), "k", all_specs()).unwrap();
    let state = aggs.state_schema();
    let described: Vec<(String, DataType, bool)> = state
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone(), f.is_nullable()))
        .collect();
    let f = |n: &str, t: DataType, null: bool| (n.to_string(), t, null);
    use DataType::{Float64 as F, Int64 as I, Utf8 as S};
    assert_eq!(
        described,
        vec![
            f("k", I, false),
            f("rows", I, false),
            f("n_v", I, false),
            f("sum_v", I, true),
            f("sum_f", F, true),
            f("min_v", I, true),
            f("max_f", F, true),
            f("min_s", S, true),
            f("max_s", S, true),
            f("first_v", I, true),
            f("last_s", S, true),
            f("avg_v__sum", I, false),
            f("avg_v__count", I, false),
            f("avg_f__sum", F, false),
            f("avg_f__count", I, false),
        ]
    );
    assert_eq!(state.metadata()["snapcut.key"], "k");
    let out: Vec<(String, DataType)> = aggs
        .output_schema()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect();
    assert_eq!(out.len(), 13);
    assert_eq!(out[11], ("avg_v".to_string(), F));
    assert_eq!(out[12], ("avg_f".to_string(), F));
    // A table made from the state schema has exactly that schema.
    let table = StateTable::new(state.clone(), "k", StatePolicy::default()).unwrap();
    assert_eq!(table.schema(), state);
}

#[test]
fn output_turns_state_into_results_with_exact_means() {
    let (aggs, mut table) = setup(vec![
        AggSpec::mean("v", "avg"),
        AggSpec::sum("v", "total"),
        AggSpec::count_rows("n"),
    ]);
    let big = i64::MAX / 2;
    let rows = [
        (1, Some(big), None, None),
        (1, Some(big), None, None),
        (1, Some(-big), None, None),
        (2, None, None, None),
    ];
    let state = aggs.apply(&mut table, &batch(&rows)).unwrap();
    let out = aggs.output(&state).unwrap();
    assert_eq!(out.schema(), aggs.output_schema());
    let avg = out.column(1).as_primitive::<Float64Type>();
    // The Int64 sum is exact (a float sum would lose the low bits).
    assert_eq!(avg.value(0), big as f64 / 3.0);
    assert!(avg.is_null(1), "mean of no values is null");
    let total = out.column(2).as_primitive::<Int64Type>();
    assert_eq!(total.value(0), big);
    assert!(total.is_null(1), "sum of only nulls is null, as in Spark");
    assert_eq!(
        out.column(3).as_primitive::<Int64Type>().values().to_vec(),
        vec![3, 1]
    );
    // The table's rows give the same results.
    assert_eq!(aggs.output(&table.to_batch()).unwrap().num_rows(), 2);
}

#[test]
fn integer_and_float_inputs_keep_integer_and_float_sums() {
    let schema = Schema::new(vec![
        Field::new("k", DataType::Utf8, false),
        Field::new("u", DataType::UInt64, true),
        Field::new("g", DataType::Float32, true),
    ]);
    let specs = vec![
        AggSpec::sum("u", "su"),
        AggSpec::sum("g", "sg"),
        AggSpec::mean("g", "mg"),
        AggSpec::max("g", "xg"),
    ];
    let aggs = KeyedAggregates::new(&schema, "k", specs).unwrap();
    let types: Vec<DataType> = aggs
        .state_schema()
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect();
    use DataType::*;
    assert_eq!(types, vec![Utf8, Int64, Float64, Float64, Int64, Float32]);
    let mut table = StateTable::new(aggs.state_schema(), "k", StatePolicy::default()).unwrap();
    let b = RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(StringArray::from(vec!["a", "a", "b"])) as ArrayRef,
            Arc::new(UInt64Array::from(vec![Some(3), Some(4), None])),
            Arc::new(Float32Array::from(vec![Some(0.5), Some(0.25), Some(2.0)])),
        ],
    )
    .unwrap();
    let state = aggs.apply(&mut table, &b).unwrap();
    assert_eq!(state.column(1).as_primitive::<Int64Type>().value(0), 7);
    assert!(state.column(1).is_null(1));
    assert_eq!(state.column(2).as_primitive::<Float64Type>().value(0), 0.75);
    let out = aggs.output(&state).unwrap();
    assert_eq!(out.column(3).as_primitive::<Float64Type>().value(0), 0.375);
}

#[test]
fn first_and_last_are_the_first_and_last_non_null_values_in_arrival_order() {
    let (aggs, mut table) = setup(vec![
        AggSpec::first("v", "fv"),
        AggSpec::last("v", "lv"),
        AggSpec::first("s", "fs"),
        AggSpec::last("s", "ls"),
    ]);
    let steps: [&[Row]; 3] = [
        &[(1, None, None, None), (1, Some(4), None, Some("p"))],
        &[
            (1, Some(5), None, None),
            (1, None, None, Some("q")),
            (2, None, None, None),
        ],
        &[(1, None, None, None), (2, Some(6), None, Some("r"))],
    ];
    for rows in steps {
        aggs.apply(&mut table, &batch(rows)).unwrap();
    }
    let got = rows_of(&table.to_batch());
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(got[&1], v(&["4", "5", "p", "q"]));
    assert_eq!(got[&2], v(&["6", "6", "r", "r"]));
}

#[test]
fn min_max_order_nan_above_numbers_like_spark() {
    let (aggs, mut table) = setup(vec![AggSpec::min("f", "lo"), AggSpec::max("f", "hi")]);
    let rows = [
        (1, None, Some(f64::NAN), None),
        (1, None, Some(2.0), None),
        (1, None, Some(-1.0), None),
        (2, None, Some(f64::NAN), None),
    ];
    aggs.apply(&mut table, &batch(&rows)).unwrap();
    let got = rows_of(&table.to_batch());
    assert_eq!(got[&1], vec!["-1.0".to_string(), "NaN".into()]);
    assert_eq!(got[&2], vec!["NaN".to_string(), "NaN".into()]);
}

#[test]
fn a_checkpoint_after_apply_holds_only_the_touched_keys() {
    let (aggs, mut table) = setup(vec![AggSpec::sum("v", "t")]);
    let rows: Vec<Row> = (0..100).map(|k| (k, Some(k), None, None)).collect();
    aggs.apply(&mut table, &batch(&rows)).unwrap();
    assert_eq!(table.checkpoint(1).unwrap().kind, StateKind::Full);
    aggs.apply(
        &mut table,
        &batch(&[
            (5, Some(1), None, None),
            (500, Some(2), None, None),
            (5, Some(1), None, None),
        ]),
    )
    .unwrap();
    let cap = table.checkpoint(2).unwrap();
    assert_eq!(cap.kind, StateKind::Diff { base: 1 });
    let keys: Vec<i64> = cap
        .batch
        .column(0)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(keys, vec![5, 500]);
    let sums: Vec<i64> = cap
        .batch
        .column(1)
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    assert_eq!(sums, vec![7, 2]);
    assert_eq!(
        cap.batch
            .column_by_name(DELETED_COLUMN)
            .unwrap()
            .as_boolean()
            .true_count(),
        0
    );
}

#[test]
fn extra_batch_columns_are_ignored_and_empty_batches_change_nothing() {
    let (aggs, mut table) = setup(vec![AggSpec::count_rows("n")]);
    let narrow = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("extra", DataType::Utf8, true),
            Field::new("k", DataType::Int64, true),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["x"])) as ArrayRef,
            Arc::new(Int64Array::from(vec![3])),
        ],
    )
    .unwrap();
    aggs.apply(&mut table, &narrow).unwrap();
    assert_eq!(table.len(), 1);
    table.checkpoint(1).unwrap();
    let out = aggs.apply(&mut table, &batch(&[])).unwrap();
    assert_eq!(out.num_rows(), 0);
    assert_eq!(table.changed_len(), 0);
}

fn config_err(r: crate::error::Result<impl std::fmt::Debug>) -> String {
    match r {
        Err(Error::Config(m)) => m,
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn bad_specs_are_config_errors_that_name_the_fix() {
    let s = input_schema();
    let new = |specs: Vec<AggSpec>| KeyedAggregates::new(&s, "k", specs).map(|_| ());
    let cases: Vec<(Vec<AggSpec>, &str)> = vec![
        (vec![], "at least one aggregate"),
        (vec![AggSpec::sum("nope", "x")], "not in the input schema"),
        (vec![AggSpec::sum("s", "x")], "needs a numeric column"),
        (vec![AggSpec::mean("s", "x")], "needs a numeric column"),
        (
            vec![AggSpec {
                func: AggFunc::Sum,
                column: None,
                output: "x".into(),
            }],
            "only count may have none",
        ),
        (vec![AggSpec::count("v", "k")], "equals the key"),
        (
            vec![AggSpec::count("v", "a"), AggSpec::sum("v", "a")],
            "used twice",
        ),
        (vec![AggSpec::count("v", "__a")], "starts with '__'"),
        (vec![AggSpec::count("v", "")], "empty"),
        (
            vec![AggSpec::mean("v", "m"), AggSpec::sum("v", "m__sum")],
            "clashes",
        ),
    ];
    for (specs, want) in cases {
        let msg = config_err(new(specs.clone()));
        assert!(msg.contains(want), "{specs:?}: {msg}");
    }
    let msg = config_err(KeyedAggregates::new(
        &s,
        "missing",
        vec![AggSpec::count_rows("n")],
    ));
    assert!(msg.contains("not in the input schema"), "{msg}");
    let msg = config_err(KeyedAggregates::new(
        &s,
        "f",
        vec![AggSpec::count_rows("n")],
    ));
    assert!(msg.contains("encode_keys"), "{msg}");
    let msg = config_err("median".parse::<AggFunc>());
    assert!(
        msg.contains("count, sum, min, max, mean, first, last"),
        "{msg}"
    );
    assert_eq!("last".parse::<AggFunc>().unwrap(), AggFunc::Last);
}

#[test]
fn bad_batches_and_tables_are_config_errors_and_change_nothing() {
    let (aggs, mut table) = setup(vec![AggSpec::sum("v", "t")]);
    let keys = Int64Array::from(vec![Some(1), None, None]);
    let b = RecordBatch::try_new(
        input_schema(),
        vec![
            Arc::new(keys) as ArrayRef,
            Arc::new(Int64Array::from(vec![1, 2, 3])),
            Arc::new(Float64Array::from(vec![0.0; 3])),
            Arc::new(StringArray::from(vec!["a"; 3])),
        ],
    )
    .unwrap();
    let msg = config_err(aggs.apply(&mut table, &b));
    assert!(
        msg.contains("holds 2 null(s)") && msg.contains("filter or fill"),
        "{msg}"
    );

    let wrong = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Float64, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![1])) as ArrayRef,
            Arc::new(Float64Array::from(vec![1.0])),
        ],
    )
    .unwrap();
    let msg = config_err(aggs.apply(&mut table, &wrong));
    assert!(msg.contains("cast it first"), "{msg}");

    let mut other = StateTable::new(
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)])),
        "k",
        StatePolicy::default(),
    )
    .unwrap();
    let msg = config_err(aggs.apply(&mut other, &batch(&[(1, Some(1), None, None)])));
    assert!(msg.contains("create it from their state_schema"), "{msg}");
    assert!(table.is_empty() && other.is_empty());

    let msg = config_err(aggs.output(&batch(&[])));
    assert!(msg.contains("no column 't'"), "{msg}");
}

#[test]
fn integer_overflow_fails_and_leaves_the_table_unchanged() {
    let (aggs, mut table) = setup(vec![AggSpec::sum("v", "t")]);
    aggs.apply(&mut table, &batch(&[(1, Some(i64::MAX), None, None)]))
        .unwrap();
    let before = table.to_batch();
    let err = aggs
        .apply(
            &mut table,
            &batch(&[(2, Some(1), None, None), (1, Some(1), None, None)]),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Task(_)), "{err}");
    assert!(
        err.to_string().contains("cast the column to float64"),
        "{err}"
    );
    assert_eq!(table.to_batch(), before);
}
