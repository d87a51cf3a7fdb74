//! Two threads move many items across small rings; FIFO order and a checksum are
//! verified on the receiving side. 100 M items per test in release, 1 M in debug.

use snapcut_core::channel::{channel, TryRecvError, TrySendError};
use std::sync::Mutex;
use std::thread;

/// The tests each need two cores; running them one at a time keeps them fast on a
/// small (or shared) machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Backs off in the test's own try-loops: spin a little, then yield the core.
fn backoff(failures: &mut u32) {
    *failures += 1;
    if *failures < 64 {
        std::hint::spin_loop();
    } else {
        thread::yield_now();
    }
}

fn total_items() -> u64 {
    if cfg!(debug_assertions) {
        1_000_000
    } else {
        100_000_000
    }
}

/// (capacity, percent of the items). Tiny rings need a cross-core handoff (and on a
/// busy machine often a wake-up) every item or two, so they get fewer of the items;
/// the percentages add up to 100 so the whole test moves `total_items()`.
const CAPACITIES: [(usize, u64); 5] = [(2, 4), (3, 6), (7, 10), (16, 20), (64, 60)];

fn share(percent: u64) -> u64 {
    total_items() / 100 * percent
}

fn checksum(acc: u64, v: u64) -> u64 {
    acc.rotate_left(5) ^ v.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[test]
fn single_items_blocking_and_try_mixed() {
    let _serial = serial();
    for (cap, percent) in CAPACITIES {
        let n = share(percent);
        let (mut tx, mut rx) = channel::<u64>(cap);
        let producer = thread::spawn(move || {
            let mut sum = 0u64;
            for i in 0..n {
                sum = checksum(sum, i);
                // Alternate spinning try_send and the blocking send.
                if i % 1024 < 512 {
                    let mut v = i;
                    let mut failures = 0;
                    loop {
                        match tx.try_send(v) {
                            Ok(()) => break,
                            Err(TrySendError::Full(back)) => {
                                v = back;
                                backoff(&mut failures);
                            }
                            Err(TrySendError::Disconnected(_)) => panic!("receiver gone"),
                        }
                    }
                } else {
                    tx.send(i).unwrap();
                }
            }
            sum
        });
        let mut sum = 0u64;
        let mut expect = 0u64;
        let mut failures = 0;
        loop {
            let v = if expect % 2048 < 1024 {
                match rx.try_recv() {
                    Ok(v) => {
                        failures = 0;
                        v
                    }
                    Err(TryRecvError::Empty) => {
                        backoff(&mut failures);
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => break,
                }
            } else {
                match rx.recv() {
                    Ok(v) => v,
                    Err(_) => break,
                }
            };
            assert_eq!(v, expect, "FIFO order broken at capacity {cap}");
            sum = checksum(sum, v);
            expect += 1;
        }
        assert_eq!(expect, n, "lost items at capacity {cap}");
        assert_eq!(sum, producer.join().unwrap());
    }
}

#[test]
fn batches_of_varying_sizes() {
    let _serial = serial();
    for (cap, percent) in CAPACITIES {
        let n = share(percent);
        let (mut tx, mut rx) = channel::<u64>(cap);
        let producer = thread::spawn(move || {
            let mut buf = Vec::with_capacity(100);
            let mut next = 0u64;
            let mut sum = 0u64;
            let mut round = 0usize;
            while next < n {
                let len = ((round * 7919) % 97 + 1).min((n - next) as usize);
                buf.clear();
                buf.extend(next..next + len as u64);
                for &v in &buf {
                    sum = checksum(sum, v);
                }
                if round % 2 == 0 {
                    tx.send_slice(&buf).unwrap();
                } else {
                    tx.send_iter(buf.iter().copied()).unwrap();
                }
                next += len as u64;
                round += 1;
            }
            sum
        });
        let mut sum = 0u64;
        let mut expect = 0u64;
        let mut vec = Vec::with_capacity(128);
        let mut arr = [0u64; 61];
        let mut round = 0usize;
        loop {
            vec.clear();
            let got = if round % 2 == 0 {
                rx.recv_into(&mut vec, (round % 89) + 1).map(|_| &vec[..])
            } else {
                let m = (round % 61) + 1;
                rx.recv_slice(&mut arr[..m]).map(|k| &arr[..k])
            };
            let Ok(items) = got else { break };
            for &v in items {
                assert_eq!(v, expect, "FIFO order broken at capacity {cap}");
                sum = checksum(sum, v);
                expect += 1;
            }
            round += 1;
        }
        assert_eq!(expect, n, "lost items at capacity {cap}");
        assert_eq!(sum, producer.join().unwrap());
    }
}
