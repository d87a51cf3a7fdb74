//! State + store benchmark: N keys (default 10 million), 1% changed between
//! checkpoints. Measures the sync phase of a checkpoint, bytes written per
//! incremental vs full checkpoint, the async write, and restore from a full +
//! 10 diffs. Plain `main` (no criterion): the setup is too big to repeat.
//!
//! Run: `cargo bench -p snapcut-core --bench state` (SNAPCUT_BENCH_KEYS=... to resize).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Float64Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use snapcut_core::protocol::ProtocolKind;
use snapcut_core::snapshot::{CheckpointMeta, SnapshotSink, TaskId, TaskSnapshot};
use snapcut_core::state::{StatePolicy, StateTable};
use snapcut_core::store::{FileRole, SnapshotReader, SnapshotStore, StoreOptions};

const DIFFS: u64 = 10;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Int64, false),
        Field::new("count", DataType::Int64, false),
        Field::new("total", DataType::Float64, true),
    ]))
}

fn batch(keys: Vec<i64>, round: i64) -> RecordBatch {
    let counts: Vec<i64> = keys.iter().map(|k| k + round).collect();
    let totals: Vec<f64> = keys.iter().map(|&k| (k * 3 + round) as f64).collect();
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(keys)),
            Arc::new(Int64Array::from(counts)),
            Arc::new(Float64Array::from(totals)),
        ],
    )
    .unwrap()
}

/// xorshift64*: reproducible key picks without a dependency.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let n: u64 = std::env::var("SNAPCUT_BENCH_KEYS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    let changed = (n / 100).max(1);
    let dir = std::env::var("SNAPCUT_BENCH_DIR").map_or_else(
        |_| std::env::temp_dir().join(format!("snapcut-bench-state-{}", std::process::id())),
        std::path::PathBuf::from,
    );
    let _ = std::fs::remove_dir_all(&dir);
    let task = TaskId {
        vertex: "agg".into(),
        subtask: 0,
    };
    // SNAPCUT_BENCH_MATERIALIZE=1: tables send only diffs; the store merges
    // a task's runs in the background once DIFFS diffs sit on its full.
    let materialize = std::env::var("SNAPCUT_BENCH_MATERIALIZE").is_ok_and(|v| v == "1");
    let options = StoreOptions {
        retain: 20,
        materialize_every: materialize.then_some(DIFFS as usize),
        ..Default::default()
    };
    let full_every = if materialize {
        u32::MAX
    } else {
        DIFFS as u32 + 1
    };
    let store = SnapshotStore::open(&dir, options).unwrap();
    let mut table = StateTable::new(schema(), "key", StatePolicy { full_every }).unwrap();

    let t = Instant::now();
    let chunk = 1_000_000u64;
    for start in (0..n).step_by(chunk as usize) {
        let keys: Vec<i64> = (start..(start + chunk).min(n)).map(|k| k as i64).collect();
        table.upsert(&batch(keys, 0)).unwrap();
    }
    let load = t.elapsed();

    let meta = |id| CheckpointMeta {
        id,
        protocol: ProtocolKind::Aligned,
        started_ms: 0,
        finished_ms: 0,
        graph_fingerprint: "bench".into(),
        savepoint: false,
    };
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut sync_diff = Vec::new();
    let mut async_diff = Vec::new();
    let mut update = Vec::new();
    let mut handoffs = Vec::new();
    let mut sync_full = Duration::ZERO;
    let mut async_full = Duration::ZERO;
    for id in 1..=DIFFS + 1 {
        if id > 1 {
            // 1% of keys change: 90% overwritten, 10% deleted (tombstones).
            let keys: Vec<i64> = (0..changed).map(|_| rng.below(n) as i64).collect();
            let (del, up) = keys.split_at(keys.len() / 10);
            let t = Instant::now();
            table.upsert(&batch(up.to_vec(), id as i64)).unwrap();
            table.delete(&Int64Array::from(del.to_vec())).unwrap();
            update.push(t.elapsed());
        }
        let t = Instant::now();
        let capture = table.checkpoint(id).unwrap();
        let sync = t.elapsed();
        let t = Instant::now();
        store
            .task_snapshot(
                id,
                TaskSnapshot {
                    task: task.clone(),
                    state: Some(capture),
                    state_runs: None,
                    channels: vec![],
                    source_offset: None,
                    alignment_nanos: 0,
                    sent_seq: Vec::new(),
                    taken_seq: Vec::new(),
                },
            )
            .unwrap();
        let handoff = t.elapsed();
        store.commit(meta(id)).unwrap();
        let written = t.elapsed();
        if materialize && id == DIFFS + 1 {
            println!(
                "| commit that hands the store's compactor its first merge (id {id}) | {:.0} ms |",
                ms(written)
            );
        }
        if id == 1 {
            sync_full = sync;
            async_full = written;
        } else {
            sync_diff.push(sync);
            async_diff.push(written);
        }
        if id > 1 {
            handoffs.push(handoff);
        }
    }

    let reader = SnapshotReader::open(&dir).unwrap();
    let bytes = |id| {
        let m = reader.manifest(id).unwrap();
        m.files
            .iter()
            .find(|f| f.role == FileRole::State)
            .unwrap()
            .bytes
    };
    let full_bytes = bytes(1);
    let mut diff_bytes: Vec<u64> = (2..=DIFFS + 1).map(bytes).collect();
    diff_bytes.sort_unstable();
    let diff_bytes = diff_bytes[diff_bytes.len() / 2];

    let mut restore = Vec::new();
    let mut read = Vec::new();
    let mut chain_len = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let chain = reader.state_chain(DIFFS + 1, &task).unwrap();
        read.push(t.elapsed());
        chain_len = chain.len();
        let mut restored = StateTable::new(
            schema(),
            "key",
            StatePolicy {
                full_every: DIFFS as u32 + 1,
            },
        )
        .unwrap();
        restored.restore(&chain).unwrap();
        restore.push(t.elapsed());
        assert_eq!(restored.len(), table.len());
    }

    println!(
        "keys: {n}, changed per checkpoint: {changed} (10% of them deletes), chain: 1 full + {DIFFS} diffs, store compacts: {materialize}"
    );
    println!("| measure | median |");
    println!("|---|---|");
    println!("| initial load ({n} upserts) | {:.0} ms |", ms(load));
    println!(
        "| apply 1% changes (upserts + deletes) | {:.2} ms |",
        ms(median(update))
    );
    println!(
        "| sync phase, diff checkpoint | {:.3} ms |",
        ms(median(sync_diff))
    );
    println!(
        "| sync phase, full checkpoint (every {}th) | {:.1} ms |",
        DIFFS + 1,
        ms(sync_full)
    );
    println!(
        "| task_snapshot hand-off (task stalls this long) | {:.3} ms |",
        ms(median(handoffs))
    );
    println!(
        "| async write + commit, diff | {:.1} ms |",
        ms(median(async_diff))
    );
    println!("| async write + commit, full | {:.1} ms |", ms(async_full));
    println!("| bytes, full checkpoint | {full_bytes} |");
    println!("| bytes, diff checkpoint | {diff_bytes} |");
    println!(
        "| diff / full bytes | {:.2}% |",
        100.0 * diff_bytes as f64 / full_bytes as f64
    );
    println!(
        "| restore: read + verify chain | {:.0} ms |",
        ms(median(read))
    );
    println!(
        "| restore: chain of {chain_len} file(s) into a table | {:.0} ms |",
        ms(median(restore))
    );
    let _ = std::fs::remove_dir_all(&dir);
}
