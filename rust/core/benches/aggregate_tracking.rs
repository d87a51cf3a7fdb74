//! What tracking changed keys costs the keyed aggregate, per record: a
//! capture after every interval (a checkpoint every interval, so the set of
//! changed keys is tracked, and each capture is a diff of it) against no
//! captures at all (once every key is in the set, a batch costs one
//! comparison). Keys are drawn so that an interval writes most keys but not
//! all of them: the case where tracking cannot back off. One operator on
//! this thread, no channels, no store: only the operator's own work.
//! Prints medians and the ratio from one run.
//!
//! Run: `cargo bench -p snapcut-core --bench aggregate_tracking`
//! (env KEYS, INTERVAL_ROWS, INTERVALS, RUNS to resize).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use snapcut_core::operator::{Emitter, Operator};
use snapcut_core::runtime::ops::{keyed_aggregate_forwarding, AggSpec};

const BATCH: usize = 1024;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Drops what the operator passes on.
struct Discard;
impl Emitter for Discard {
    fn emit(&mut self, _batch: RecordBatch) -> snapcut_core::error::Result<()> {
        Ok(())
    }
}

/// xorshift64*: reproducible keys without a dependency.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// One interval's batches: `rows` uniform draws over `keys` (with as many
/// draws as keys, about 63 % of the keys are written).
fn interval(rng: &mut Rng, keys: u64, rows: u64) -> Vec<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("user", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    (0..rows.div_ceil(BATCH as u64))
        .map(|_| {
            let k: Vec<i64> = (0..BATCH).map(|_| rng.below(keys) as i64).collect();
            let v: Vec<i64> = k.iter().map(|x| x & 1023).collect();
            RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from(k)), Arc::new(Int64Array::from(v))],
            )
            .unwrap()
        })
        .collect()
}

/// Time to fold every interval in, with a capture (and its commit) after
/// each one if `capture`.
fn run(data: &[Vec<RecordBatch>], keys: u64, capture: bool) -> Duration {
    let factory = keyed_aggregate_forwarding(
        "user",
        vec![AggSpec::count("v", "n"), AggSpec::sum("v", "total")],
    )
    .unwrap();
    let mut op: Box<dyn Operator> = factory.create(0, 1).unwrap();
    op.set_full_every(1_000_000);
    // Every key inserted first, so that both sides fold into a table of `keys`.
    let all: Vec<i64> = (0..keys as i64).collect();
    let schema = data[0][0].schema();
    let warm = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(all.clone())),
            Arc::new(Int64Array::from(all)),
        ],
    )
    .unwrap();
    op.process(0, warm, &mut Discard).unwrap();
    op.snapshot(1).unwrap();
    op.commit(1).unwrap();
    let t = Instant::now();
    for (i, batches) in data.iter().enumerate() {
        for b in batches {
            op.process(0, b.clone(), &mut Discard).unwrap();
        }
        if capture {
            let id = i as u64 + 2;
            std::hint::black_box(op.snapshot(id).unwrap());
            op.commit(id).unwrap();
        }
    }
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs us too: keep that quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let keys = env("KEYS", if quick { 1_000 } else { 100_000 });
    let rows = env("INTERVAL_ROWS", keys);
    let intervals = env("INTERVALS", if quick { 3 } else { 100 });
    let runs = env("RUNS", if quick { 1 } else { 7 }) as usize;
    let mut rng = Rng(7);
    let data: Vec<_> = (0..intervals)
        .map(|_| interval(&mut rng, keys, rows))
        .collect();
    let records = data
        .iter()
        .flatten()
        .map(|b| b.num_rows() as f64)
        .sum::<f64>();
    let (mut off, mut on) = (Vec::new(), Vec::new());
    // Alternating, so that drift on a shared machine hits both sides alike.
    for _ in 0..runs {
        off.push(run(&data, keys, false));
        on.push(run(&data, keys, true));
    }
    let ns = |d: Duration| d.as_secs_f64() * 1e9 / records;
    let (off, on) = (median(off), median(on));
    println!(
        "keys {keys}, {rows} rows an interval, {intervals} intervals, {runs} runs (medians)\n\
         no captures:               {:.2} ns/record\n\
         a capture every interval:  {:.2} ns/record\n\
         ratio:                     {:.3}",
        ns(off),
        ns(on),
        on.as_secs_f64() / off.as_secs_f64()
    );
}
