//! The producing end.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

use super::error::{SendError, SendTimeoutError, TrySendError};
use super::ring::Ring;
use super::sync::Arc;
use super::waker::WakerRef;

/// The sending end of a channel (single producer: not `Clone`, not `Sync`).
pub struct Sender<T> {
    ring: Arc<Ring<T>>,
    /// The authoritative tail: only this end writes it.
    tail: usize,
    /// Last head seen: the receiver is at least this far, so refreshing it (a load
    /// of the receiver's cache line) is only needed when the ring looks full.
    head_cache: Cell<usize>,
    capacity: usize,
    /// The receiver's waker, notified after every publish.
    peer: WakerRef,
}

impl<T> Sender<T> {
    pub(crate) fn new(ring: Arc<Ring<T>>) -> Self {
        let capacity = ring.capacity;
        let peer = ring.receiver_waker.clone();
        Self {
            ring,
            tail: 0,
            head_cache: Cell::new(0),
            capacity,
            peer,
        }
    }

    /// Sends `value` if a slot is free; never blocks.
    #[inline]
    pub fn try_send(&mut self, value: T) -> Result<(), TrySendError<T>> {
        if self.ring.closed.receiver.load(Relaxed) {
            return Err(TrySendError::Disconnected(value));
        }
        if self.tail.wrapping_sub(self.head_cache.get()) == self.capacity && self.free_slots() == 0
        {
            return Err(TrySendError::Full(value));
        }
        // SAFETY: the slot at tail is free (checked above) and only this end writes it.
        unsafe { self.ring.write(self.tail, value) };
        self.publish(self.tail.wrapping_add(1));
        Ok(())
    }

    /// Sends `value`, waiting while the ring is full (spin, yield, then park).
    /// Fails, handing the value back, if the receiver is dropped.
    pub fn send(&mut self, value: T) -> Result<(), SendError<T>> {
        self.send_deadline(value, None)
            .map_err(|e| SendError(e.into_inner()))
    }

    /// [`send`](Self::send) that gives up after `timeout`.
    pub fn send_timeout(&mut self, value: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        self.send_deadline(value, Instant::now().checked_add(timeout))
    }

    /// [`send`](Self::send) that gives up at `deadline` (`None`: never).
    pub fn send_deadline(
        &mut self,
        mut value: T,
        deadline: Option<Instant>,
    ) -> Result<(), SendTimeoutError<T>> {
        loop {
            match self.try_send(value) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Disconnected(v)) => {
                    return Err(SendTimeoutError::Disconnected(v))
                }
                Err(TrySendError::Full(v)) => value = v,
            }
            if !self.wait_ready(deadline) {
                return Err(SendTimeoutError::Timeout(value));
            }
        }
    }

    /// Copies as many of `items` as fit (possibly none) and publishes them at once.
    /// Returns how many were sent; fails (sending nothing) if the receiver is gone.
    pub fn try_send_slice(&mut self, items: &[T]) -> Result<usize, SendError<()>>
    where
        T: Copy,
    {
        if self.ring.closed.receiver.load(Relaxed) {
            return Err(SendError(()));
        }
        let n = self.free_slots_for(items.len()).min(items.len());
        if n > 0 {
            // SAFETY: n slots from tail are free and owned by this end.
            unsafe { self.ring.write_slice(self.tail, &items[..n]) };
            self.publish(self.tail.wrapping_add(n));
        }
        Ok(n)
    }

    /// Sends all of `items`, waiting for space as needed; every wait publishes what
    /// fitted at once. On disconnection returns how many were sent.
    pub fn send_slice(&mut self, mut items: &[T]) -> Result<(), SendError<usize>>
    where
        T: Copy,
    {
        let total = items.len();
        while !items.is_empty() {
            match self.try_send_slice(items) {
                Ok(n) => items = &items[n..],
                Err(_) => return Err(SendError(total - items.len())),
            }
            if !items.is_empty() {
                self.wait_ready(None);
            }
        }
        Ok(())
    }

    /// Moves values out of `iter` while slots are free (never taking a value it cannot
    /// store) and publishes them at once. Returns how many were sent.
    pub fn try_send_iter<I: Iterator<Item = T>>(
        &mut self,
        iter: &mut I,
    ) -> Result<usize, SendError<()>> {
        if self.ring.closed.receiver.load(Relaxed) {
            return Err(SendError(()));
        }
        let free = self.free_slots_for(usize::MAX);
        let mut n = 0;
        while n < free {
            let Some(value) = iter.next() else { break };
            // SAFETY: slot tail+n is free (n < free) and owned by this end.
            unsafe { self.ring.write(self.tail.wrapping_add(n), value) };
            n += 1;
        }
        if n > 0 {
            self.publish(self.tail.wrapping_add(n));
        }
        Ok(n)
    }

    /// Sends every value of `items`, waiting for space as needed and publishing one
    /// batch per wait. On disconnection hands back the first unsent value (pass
    /// `iter.by_ref()` to keep the rest).
    pub fn send_iter<I: IntoIterator<Item = T>>(&mut self, items: I) -> Result<(), SendError<T>> {
        let mut iter = items.into_iter().peekable();
        while iter.peek().is_some() {
            if self.try_send_iter(&mut iter).is_err() {
                let value = iter.next().expect("peeked above");
                return Err(SendError(value));
            }
            if iter.peek().is_some() {
                self.wait_ready(None);
            }
        }
        Ok(())
    }

    /// Free slots, refreshing the receiver's index only if fewer than `want` look free.
    #[inline(always)]
    fn free_slots_for(&self, want: usize) -> usize {
        let free = self.capacity - self.tail.wrapping_sub(self.head_cache.get());
        if free >= want {
            free
        } else {
            self.free_slots()
        }
    }

    /// Free slots right now (refreshes the cached head).
    #[inline]
    pub fn free_slots(&self) -> usize {
        let head = self.ring.head.load(Acquire);
        self.head_cache.set(head);
        self.capacity - self.tail.wrapping_sub(head)
    }

    #[inline(always)]
    fn publish(&mut self, tail: usize) {
        self.tail = tail;
        self.ring.tail.store(tail, Release);
        self.peer.notify();
    }

    /// Waits until a slot is free or the receiver is gone; false on timeout.
    fn wait_ready(&self, deadline: Option<Instant>) -> bool {
        self.ring
            .sender_waker
            .wait_until_deadline(|| self.is_ready(), deadline)
    }

    /// True if a send would not block: a slot is free or the receiver is gone. Use it
    /// in the condition of [`TaskWaker::wait_until`] for tasks with several outputs.
    pub fn is_ready(&self) -> bool {
        self.free_slots() > 0 || self.is_disconnected()
    }

    /// True once the receiver has been dropped.
    pub fn is_disconnected(&self) -> bool {
        self.ring.is_receiver_closed()
    }

    /// Values queued and not yet received (a snapshot).
    pub fn len(&self) -> usize {
        self.capacity - self.free_slots()
    }

    /// True if nothing is queued (a snapshot).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True if no slot is free (a snapshot).
    pub fn is_full(&self) -> bool {
        self.free_slots() == 0
    }

    /// The fixed capacity given at construction.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The waker this end sleeps on when the ring is full.
    pub fn waker(&self) -> &WakerRef {
        &self.ring.sender_waker
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.ring.closed.sender.store(true, Release);
        self.peer.notify();
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .field("disconnected", &self.is_disconnected())
            .finish()
    }
}
