//! Random operation sequences on one thread against a `VecDeque` model.

use proptest::prelude::*;
use snapcut_core::channel::{channel, TryRecvError, TrySendError};
use std::collections::VecDeque;

#[derive(Debug, Clone)]
enum Op {
    TrySend,
    TryRecv,
    SendSlice(usize),
    SendIter(usize),
    RecvInto(usize),
    RecvSlice(usize),
    Peek,
    Queued,
    Len,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::TrySend),
        3 => Just(Op::TryRecv),
        1 => (0usize..12).prop_map(Op::SendSlice),
        1 => (0usize..12).prop_map(Op::SendIter),
        1 => (0usize..12).prop_map(Op::RecvInto),
        1 => (0usize..12).prop_map(Op::RecvSlice),
        1 => Just(Op::Peek),
        1 => Just(Op::Queued),
        1 => Just(Op::Len),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn matches_vecdeque_model(
        cap in prop_oneof![Just(1usize), Just(2), Just(3), Just(5), Just(8), Just(13)],
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let (mut tx, mut rx) = channel::<u64>(cap);
        let mut model: VecDeque<u64> = VecDeque::new();
        let mut next = 0u64;
        for op in ops {
            match op {
                Op::TrySend => {
                    let r = tx.try_send(next);
                    if model.len() < cap {
                        prop_assert!(r.is_ok());
                        model.push_back(next);
                    } else {
                        prop_assert_eq!(r, Err(TrySendError::Full(next)));
                    }
                    next += 1;
                }
                Op::TryRecv => match model.pop_front() {
                    Some(v) => prop_assert_eq!(rx.try_recv(), Ok(v)),
                    None => prop_assert_eq!(rx.try_recv(), Err(TryRecvError::Empty)),
                },
                Op::SendSlice(n) => {
                    let items: Vec<u64> = (next..next + n as u64).collect();
                    let sent = tx.try_send_slice(&items).unwrap();
                    prop_assert_eq!(sent, n.min(cap - model.len()));
                    model.extend(&items[..sent]);
                    next += sent as u64;
                }
                Op::SendIter(n) => {
                    let mut it = next..next + n as u64;
                    let sent = tx.try_send_iter(&mut it).unwrap();
                    prop_assert_eq!(sent, n.min(cap - model.len()));
                    // Values that did not fit stay in the iterator.
                    prop_assert_eq!(it.next(), (sent < n).then_some(next + sent as u64));
                    model.extend(next..next + sent as u64);
                    next += sent as u64;
                }
                Op::RecvInto(n) => {
                    let mut out = vec![7u64];
                    let r = rx.try_recv_into(&mut out, n);
                    let want: Vec<u64> = model.drain(..n.min(model.len())).collect();
                    if n > 0 && want.is_empty() {
                        prop_assert_eq!(r, Err(TryRecvError::Empty));
                    } else {
                        prop_assert_eq!(r, Ok(want.len()));
                    }
                    prop_assert_eq!(&out[1..], &want[..]);
                }
                Op::RecvSlice(n) => {
                    let mut out = vec![0u64; n];
                    let r = rx.try_recv_slice(&mut out);
                    let want: Vec<u64> = model.drain(..n.min(model.len())).collect();
                    if n > 0 && want.is_empty() {
                        prop_assert_eq!(r, Err(TryRecvError::Empty));
                    } else {
                        prop_assert_eq!(r, Ok(want.len()));
                        prop_assert_eq!(&out[..want.len()], &want[..]);
                    }
                }
                Op::Peek => prop_assert_eq!(rx.peek(), model.front()),
                Op::Queued => {
                    let seen: Vec<u64> = rx.queued().copied().collect();
                    prop_assert_eq!(seen, model.iter().copied().collect::<Vec<_>>());
                }
                Op::Len => {
                    prop_assert_eq!(rx.len(), model.len());
                    prop_assert_eq!(tx.len(), model.len());
                    prop_assert_eq!(rx.is_empty(), model.is_empty());
                    prop_assert_eq!(tx.is_full(), model.len() == cap);
                }
            }
        }
        // Drain, then disconnect: everything left arrives before Disconnected.
        drop(tx);
        for v in model {
            prop_assert_eq!(rx.try_recv(), Ok(v));
        }
        prop_assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    }
}
