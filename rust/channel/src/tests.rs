//! Single-threaded unit tests of the channel API; concurrency is covered by the
//! stress, proptest and loom suites under `rust/core/tests/`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;

#[derive(Debug)]
struct Counted(u32, Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn zero_capacity_is_a_capacity_error() {
    let err: CapacityError = try_channel::<u8>(0).unwrap_err();
    assert!(err.to_string().contains("at least 1"), "{err}");
}

#[test]
fn oversized_capacity_is_a_capacity_error() {
    let err: CapacityError = try_channel::<[u64; 1024]>(usize::MAX / 2).unwrap_err();
    assert!(err.to_string().contains("too large"), "{err}");
    assert!(try_channel::<u8>(MAX_CAPACITY + 1).is_err());
}

#[test]
#[should_panic(expected = "capacity must be at least 1")]
fn zero_capacity_panics() {
    let _ = channel::<u8>(0);
}

#[test]
fn fifo_full_and_empty() {
    let (mut tx, mut rx) = channel(3);
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    for i in 0..3 {
        tx.try_send(i).unwrap();
    }
    assert_eq!(tx.try_send(9), Err(TrySendError::Full(9)));
    assert_eq!((tx.len(), rx.len(), tx.capacity()), (3, 3, 3));
    assert!(tx.is_full());
    for i in 0..3 {
        assert_eq!(rx.try_recv(), Ok(i));
    }
    assert!(rx.is_empty() && tx.is_empty());
}

#[test]
fn wraps_around_many_times() {
    for cap in [1, 2, 3, 5, 8] {
        let (mut tx, mut rx) = channel(cap);
        for i in 0..100u32 {
            tx.try_send(i).unwrap();
            assert_eq!(rx.try_recv(), Ok(i));
        }
    }
}

#[test]
fn disconnect_after_drain() {
    let (mut tx, mut rx) = channel(4);
    tx.send(1).unwrap();
    tx.send(2).unwrap();
    drop(tx);
    assert!(rx.is_disconnected());
    assert_eq!(rx.try_recv(), Ok(1));
    assert_eq!(rx.recv(), Ok(2));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    assert_eq!(rx.recv(), Err(RecvError));
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(1)),
        Err(RecvTimeoutError::Disconnected)
    );
}

#[test]
fn send_to_dropped_receiver_hands_value_back() {
    let (mut tx, rx) = channel(2);
    drop(rx);
    assert!(tx.is_disconnected());
    assert_eq!(tx.try_send(5), Err(TrySendError::Disconnected(5)));
    assert_eq!(tx.send(6), Err(SendError(6)));
    assert_eq!(tx.try_send_slice(&[1, 2]), Err(SendError(())));
}

#[test]
fn timeouts_expire() {
    let (mut tx, mut rx) = channel(1);
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(5)),
        Err(RecvTimeoutError::Timeout)
    );
    tx.send(1).unwrap();
    assert_eq!(
        tx.send_timeout(2, Duration::from_millis(5)),
        Err(SendTimeoutError::Timeout(2))
    );
    assert_eq!(rx.recv_timeout(Duration::from_millis(5)), Ok(1));
}

#[test]
fn drops_everything_exactly_once() {
    let drops = Arc::new(AtomicUsize::new(0));
    // Receiver dropped first with values inside.
    let (mut tx, mut rx) = channel(4);
    for i in 0..3 {
        tx.send(Counted(i, drops.clone())).unwrap();
    }
    drop(rx.try_recv().unwrap());
    drop(rx);
    assert_eq!(drops.load(Ordering::SeqCst), 3);
    let back = tx
        .try_send(Counted(9, drops.clone()))
        .unwrap_err()
        .into_inner();
    assert_eq!(back.0, 9);
    drop(back);
    drop(tx);
    assert_eq!(drops.load(Ordering::SeqCst), 4);
    // Sender dropped first with values inside, then the receiver.
    let (mut tx, rx) = channel(4);
    for i in 0..4 {
        tx.send(Counted(i, drops.clone())).unwrap();
    }
    drop(tx);
    drop(rx);
    assert_eq!(drops.load(Ordering::SeqCst), 8);
}

#[test]
fn batch_slice_wraps_and_publishes() {
    let (mut tx, mut rx) = channel::<u64>(5);
    let mut out = [0u64; 8];
    let mut next = 0u64;
    let mut expect = 0u64;
    for round in 0..50 {
        let batch: Vec<u64> = (next..next + (round % 7) as u64).collect();
        let n = tx.try_send_slice(&batch).unwrap();
        next += n as u64;
        assert!(n <= 5);
        match rx.try_recv_slice(&mut out[..(round % 4) + 1]) {
            Ok(m) => {
                for v in &out[..m] {
                    assert_eq!(*v, expect);
                    expect += 1;
                }
            }
            Err(TryRecvError::Empty) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let mut rest = Vec::new();
    while let Ok(n) = rx.try_recv_into(&mut rest, 3) {
        assert!(n <= 3);
    }
    for v in rest {
        assert_eq!(v, expect);
        expect += 1;
    }
    assert_eq!(expect, next);
}

#[test]
fn send_iter_takes_only_what_fits() {
    let (mut tx, mut rx) = channel::<String>(3);
    let mut it = (0..5).map(|i| i.to_string());
    assert_eq!(tx.try_send_iter(&mut it), Ok(3));
    assert_eq!(it.next().as_deref(), Some("3"));
    let mut out = Vec::new();
    assert_eq!(rx.try_recv_into(&mut out, 10), Ok(3));
    assert_eq!(out, ["0", "1", "2"]);
    assert_eq!(rx.try_recv_into(&mut out, 0), Ok(0));
}

#[test]
fn peek_and_queued_see_everything_without_popping() {
    let (mut tx, mut rx) = channel(4);
    assert_eq!(rx.peek(), None);
    assert_eq!(rx.queued().count(), 0);
    for i in 0..4 {
        tx.send(i).unwrap();
    }
    assert_eq!(rx.peek(), Some(&0));
    let q = rx.queued();
    assert_eq!(q.len(), 4);
    assert_eq!(q.copied().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert_eq!(rx.try_recv(), Ok(0));
    tx.send(4).unwrap();
    assert_eq!(rx.queued().copied().collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    assert_eq!(rx.len(), 4);
}

#[test]
fn blocking_ends_across_threads() {
    let (mut tx, mut rx) = channel(2);
    let h = std::thread::spawn(move || {
        for i in 0..10_000u32 {
            tx.send(i).unwrap();
        }
    });
    for i in 0..10_000u32 {
        assert_eq!(rx.recv(), Ok(i));
    }
    h.join().unwrap();
    assert_eq!(rx.recv(), Err(RecvError));
}

#[test]
fn shared_waker_wakes_on_any_input() {
    let waker = TaskWaker::new();
    let (mut tx1, rx1) = channel_with_waker::<u8>(1, waker.clone()).unwrap();
    let (tx2, rx2) = channel_with_waker::<u8>(1, waker.clone()).unwrap();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        tx1.send(7).unwrap();
        tx1
    });
    waker.wait_until(|| rx1.is_ready() || rx2.is_ready());
    assert_eq!(rx1.peek(), Some(&7));
    let _tx1 = h.join().unwrap();
    drop(tx2);
    waker.wait_until(|| rx2.is_ready());
    assert!(rx2.is_disconnected());
    assert!(!waker.wait_until_timeout(|| false, Duration::from_millis(2)));
}
