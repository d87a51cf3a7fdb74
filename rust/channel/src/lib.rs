//! Lock-free bounded single-producer single-consumer FIFO ring: the edge between two tasks.
//!
//! ```
//! use snapcut_channel::channel;
//! let (mut tx, mut rx) = channel::<u64>(4);
//! tx.send(1).unwrap();
//! tx.try_send_slice(&[2, 3]).unwrap();
//! assert_eq!(rx.peek(), Some(&1));
//! assert_eq!(rx.queued().copied().collect::<Vec<_>>(), vec![1, 2, 3]);
//! let mut out = Vec::new();
//! assert_eq!(rx.recv_into(&mut out, 8), Ok(3));
//! drop(tx);
//! assert!(rx.recv().is_err()); // disconnected, and drained
//! ```
//!
//! Design (after rtrb): the head (receiver) and tail (sender) indices live on their
//! own cache lines, and each end caches the other's index so that it touches the
//! peer's line only when the ring looks full (sender) or empty (receiver). Batch
//! operations publish once per batch. Blocking operations spin, yield, then park on a
//! [`TaskWaker`]; a waker may be shared by several channels so that one task can sleep
//! until ANY of its inputs (or outputs) is ready. The publish side pays for the wake
//! check only a relaxed load (plus a compiler fence on Linux, see `sync`).

mod error;
mod receiver;
mod ring;
mod sender;
mod sync;
mod waker;

pub use error::{
    CapacityError, RecvError, RecvTimeoutError, SendError, SendTimeoutError, TryRecvError,
    TrySendError,
};
pub use receiver::{Queued, Receiver};
pub use sender::Sender;
pub use waker::{TaskWaker, WakerRef};

/// A channel's ends, or why the capacity was refused.
pub type Result<T> = std::result::Result<T, CapacityError>;

/// The largest capacity accepted (the ring allocates the next power of two).
pub const MAX_CAPACITY: usize = 1 << (usize::BITS - 2);

/// A bounded SPSC channel holding up to `capacity` values.
///
/// # Panics
/// If `capacity` is 0 or larger than [`MAX_CAPACITY`]; see [`try_channel`].
pub fn channel<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    match try_channel(capacity) {
        Ok(ends) => ends,
        Err(e) => panic!("{e}"),
    }
}

/// [`channel`] that reports a bad capacity as a [`CapacityError`].
pub fn try_channel<T>(capacity: usize) -> Result<(Sender<T>, Receiver<T>)> {
    channel_with_wakers(capacity, TaskWaker::new(), TaskWaker::new())
}

/// A channel whose receiver sleeps on `receiver_waker` (shared with the task's other
/// inputs) and a private waker for the sender.
pub fn channel_with_waker<T>(
    capacity: usize,
    receiver_waker: WakerRef,
) -> Result<(Sender<T>, Receiver<T>)> {
    channel_with_wakers(capacity, TaskWaker::new(), receiver_waker)
}

/// A channel whose ends sleep on the given wakers: `sender_waker` is notified when
/// slots are freed or the receiver is dropped, `receiver_waker` when values are
/// published or the sender is dropped. Each waker must be waited on by one thread
/// at a time (the task owning those ends).
pub fn channel_with_wakers<T>(
    capacity: usize,
    sender_waker: WakerRef,
    receiver_waker: WakerRef,
) -> Result<(Sender<T>, Receiver<T>)> {
    if capacity == 0 {
        return Err(CapacityError(
            "channel capacity must be at least 1 (got 0); pass a capacity >= 1".into(),
        ));
    }
    let bytes = capacity
        .checked_next_power_of_two()
        .and_then(|slots| slots.checked_mul(std::mem::size_of::<T>()));
    if capacity > MAX_CAPACITY || bytes.is_none_or(|b| b > isize::MAX as usize) {
        return Err(CapacityError(format!(
            "channel capacity {capacity} is too large for items of {} bytes; pass a smaller capacity",
            std::mem::size_of::<T>()
        )));
    }
    sync::init_barriers();
    let ring = sync::Arc::new(ring::Ring::new(capacity, sender_waker, receiver_waker));
    Ok((Sender::new(ring.clone()), Receiver::new(ring)))
}

#[cfg(all(test, not(feature = "loom")))]
mod tests;
