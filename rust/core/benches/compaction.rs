//! Compaction at 10M keys (issue 37): a 10M-key full state plus 4 diffs of
//! 100k changed keys each (a tenth of them deletes, keys in the order a
//! table's capture gives: upserts, then tombstones), merged and encoded as
//! the compactor does it:
//!
//! - `tier_merge`: the 4 diffs into one diff run;
//! - `base_merge`: the full and the 4 diffs into a new full;
//! - `rebuild_at_commit`: what `materialize_every` did at commit before
//!   compaction moved to the background: the chain restored into a
//!   `StateTable`, its full batch taken and encoded.
//!
//! Run: `cargo bench -p snapcut-core --bench compaction` (env
//! `SNAPCUT_BENCH_KEYS`, default 10M; `SNAPCUT_BENCH_CHANGED`, 100k).

use std::hint::black_box;
use std::sync::Arc;

use arrow_array::{BooleanArray, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use criterion::{criterion_group, criterion_main, Criterion};
use snapcut_core::snapshot::{StateCapture, StateKind};
use snapcut_core::state::{StatePolicy, StateTable, DELETED_COLUMN, KEY_METADATA};
use snapcut_core::store::format::{encode_ipc, merge_batches, MergeKind};

const DIFFS: u64 = 4;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn schema(diff: bool) -> SchemaRef {
    let mut fields = vec![
        Field::new("key", DataType::Int64, false),
        Field::new("n", DataType::Int64, false),
        Field::new("total", DataType::Int64, false),
    ];
    if diff {
        fields.push(Field::new(DELETED_COLUMN, DataType::Boolean, false));
    }
    Arc::new(Schema::new_with_metadata(
        fields,
        [(KEY_METADATA.to_string(), "key".to_string())].into(),
    ))
}

/// xorshift64*: the same inputs every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn full(keys: u64) -> RecordBatch {
    let k: Vec<i64> = (0..keys as i64).collect();
    RecordBatch::try_new(
        schema(false),
        vec![
            Arc::new(Int64Array::from(k.clone())),
            Arc::new(Int64Array::from(vec![1; keys as usize])),
            Arc::new(Int64Array::from(k)),
        ],
    )
    .unwrap()
}

/// `changed` distinct keys (a few new ones beyond the full's), upserts
/// first, then a tenth as tombstones.
fn diff(rng: &mut Rng, keys: u64, changed: u64) -> RecordBatch {
    let mut picked = std::collections::HashSet::with_capacity(changed as usize);
    while (picked.len() as u64) < changed {
        picked.insert((rng.next() % (keys + keys / 100)) as i64);
    }
    let mut k: Vec<i64> = picked.into_iter().collect();
    k.sort_unstable();
    // Fisher-Yates: a capture's order is its tracking order, not the keys'.
    for i in (1..k.len()).rev() {
        k.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let deletes = (changed / 10) as usize;
    let live = k.len() - deletes;
    let deleted: Vec<bool> = (0..k.len()).map(|i| i >= live).collect();
    let n: Vec<i64> = (0..k.len()).map(|i| if i < live { 2 } else { 0 }).collect();
    RecordBatch::try_new(
        schema(true),
        vec![
            Arc::new(Int64Array::from(k)),
            Arc::new(Int64Array::from(n.clone())),
            Arc::new(Int64Array::from(n)),
            Arc::new(BooleanArray::from(deleted)),
        ],
    )
    .unwrap()
}

fn encode(batch: &RecordBatch) -> u64 {
    encode_ipc(&batch.schema(), std::slice::from_ref(batch), "bench")
        .unwrap()
        .1
        .bytes
}

fn bench(c: &mut Criterion) {
    let keys = env("SNAPCUT_BENCH_KEYS", 10_000_000);
    let changed = env("SNAPCUT_BENCH_CHANGED", 100_000);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let base = full(keys);
    // Oldest first, as a chain lists them.
    let diffs: Vec<RecordBatch> = (0..DIFFS).map(|_| diff(&mut rng, keys, changed)).collect();
    let newest_first: Vec<RecordBatch> = diffs.iter().rev().cloned().collect();
    let mut all = newest_first.clone();
    all.push(base.clone());

    let mut group = c.benchmark_group(format!("compaction_{keys}_keys_{DIFFS}x{changed}"));
    group.sample_size(10);
    group.bench_function("tier_merge", |b| {
        b.iter(|| encode(&merge_batches(&newest_first, "key", MergeKind::Tier).unwrap()))
    });
    group.bench_function("base_merge", |b| {
        b.iter(|| encode(&merge_batches(&all, "key", MergeKind::Base).unwrap()))
    });
    let chain: Vec<_> = std::iter::once((
        0,
        StateCapture {
            kind: StateKind::Full,
            batch: base.clone(),
            filter: None,
            times: None,
        },
    ))
    .chain(diffs.iter().enumerate().map(|(i, d)| {
        let plain = d.clone();
        (
            i as u64 + 1,
            StateCapture {
                kind: StateKind::Diff { base: i as u64 },
                batch: plain,
                filter: None,
                times: None,
            },
        )
    }))
    .collect();
    group.bench_function("rebuild_at_commit", |b| {
        b.iter(|| {
            let mut table = StateTable::new(
                schema(false),
                "key",
                StatePolicy {
                    full_every: u32::MAX,
                },
            )
            .unwrap();
            table.restore(&chain).unwrap();
            black_box(encode(&table.to_batch()))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
