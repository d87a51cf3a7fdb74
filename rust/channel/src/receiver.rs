//! The consuming end.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::time::{Duration, Instant};

use super::error::{RecvError, RecvTimeoutError, TryRecvError};
use super::ring::Ring;
use super::sync::Arc;
use super::waker::WakerRef;

/// The receiving end of a channel (single consumer: not `Clone`, not `Sync`).
pub struct Receiver<T> {
    ring: Arc<Ring<T>>,
    /// The authoritative head: only this end writes it.
    head: usize,
    /// Last tail seen: at least this much is published, so refreshing it (a load of
    /// the sender's cache line) is only needed when the ring looks empty.
    tail_cache: Cell<usize>,
    capacity: usize,
    /// The sender's waker, notified after every release of slots.
    peer: WakerRef,
}

impl<T> Receiver<T> {
    pub(crate) fn new(ring: Arc<Ring<T>>) -> Self {
        let capacity = ring.capacity;
        let peer = ring.sender_waker.clone();
        Self {
            ring,
            head: 0,
            tail_cache: Cell::new(0),
            capacity,
            peer,
        }
    }

    /// Receives the oldest value if there is one; never blocks. Reports
    /// `Disconnected` only once the sender is gone AND everything it sent was received.
    #[inline]
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        if self.head == self.tail_cache.get() && self.available() == 0 {
            return Err(self.empty_error());
        }
        // SAFETY: the slot at head is published and only this end reads it.
        let value = unsafe { self.ring.read(self.head) };
        self.release(self.head.wrapping_add(1));
        Ok(value)
    }

    /// Receives the oldest value, waiting while the ring is empty (spin, yield, then
    /// park). Fails only once the sender is gone and the ring is drained.
    pub fn recv(&mut self) -> Result<T, RecvError> {
        self.recv_deadline(None).map_err(|_| RecvError)
    }

    /// [`recv`](Self::recv) that gives up after `timeout`.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.recv_deadline(Instant::now().checked_add(timeout))
    }

    /// [`recv`](Self::recv) that gives up at `deadline` (`None`: never).
    pub fn recv_deadline(&mut self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        loop {
            match self.try_recv() {
                Ok(v) => return Ok(v),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            if !self.wait_ready(deadline) {
                return Err(RecvTimeoutError::Timeout);
            }
        }
    }

    /// Moves up to `max` queued values to the end of `out`, releasing their slots with
    /// one atomic store. Returns how many (≥ 1), or why none.
    pub fn try_recv_into(&mut self, out: &mut Vec<T>, max: usize) -> Result<usize, TryRecvError> {
        if max == 0 {
            return Ok(0);
        }
        let n = self.available_for(max).min(max);
        if n == 0 {
            return Err(self.empty_error());
        }
        out.reserve(n);
        // SAFETY: n slots from head are published and owned by this end; `out` has
        // room for n more; the values move (the slots are released below, unread).
        unsafe {
            self.ring
                .read_to_ptr(self.head, out.as_mut_ptr().add(out.len()), n);
            out.set_len(out.len() + n);
        }
        self.release(self.head.wrapping_add(n));
        Ok(n)
    }

    /// [`try_recv_into`](Self::try_recv_into) that waits for at least one value.
    pub fn recv_into(&mut self, out: &mut Vec<T>, max: usize) -> Result<usize, RecvError> {
        loop {
            match self.try_recv_into(out, max) {
                Ok(n) => return Ok(n),
                Err(TryRecvError::Disconnected) => return Err(RecvError),
                Err(TryRecvError::Empty) => {}
            }
            self.wait_ready(None);
        }
    }

    /// Copies up to `out.len()` queued values into `out` and releases them at once.
    pub fn try_recv_slice(&mut self, out: &mut [T]) -> Result<usize, TryRecvError>
    where
        T: Copy,
    {
        if out.is_empty() {
            return Ok(0);
        }
        let n = self.available_for(out.len()).min(out.len());
        if n == 0 {
            return Err(self.empty_error());
        }
        // SAFETY: n published slots from head, owned by this end; `out` holds ≥ n.
        unsafe { self.ring.read_to_ptr(self.head, out.as_mut_ptr(), n) };
        self.release(self.head.wrapping_add(n));
        Ok(n)
    }

    /// [`try_recv_slice`](Self::try_recv_slice) that waits for at least one value.
    pub fn recv_slice(&mut self, out: &mut [T]) -> Result<usize, RecvError>
    where
        T: Copy,
    {
        loop {
            match self.try_recv_slice(out) {
                Ok(n) => return Ok(n),
                Err(TryRecvError::Disconnected) => return Err(RecvError),
                Err(TryRecvError::Empty) => {}
            }
            self.wait_ready(None);
        }
    }

    /// The oldest queued value, without removing it.
    pub fn peek(&self) -> Option<&T> {
        if self.head == self.tail_cache.get() && self.available() == 0 {
            return None;
        }
        // SAFETY: published slot; it stays unread while `&self` is borrowed.
        Some(unsafe { self.ring.get(self.head) })
    }

    /// Every value queued right now, oldest first, without removing any (for example
    /// to find a barrier queued behind data).
    pub fn queued(&self) -> Queued<'_, T> {
        let n = self.available();
        Queued {
            ring: &self.ring,
            next: self.head,
            end: self.head.wrapping_add(n),
        }
    }

    /// Values available right now (refreshes the cached tail).
    #[inline]
    fn available(&self) -> usize {
        let tail = self.ring.tail.load(Acquire);
        self.tail_cache.set(tail);
        tail.wrapping_sub(self.head)
    }

    /// Values available, refreshing the tail only if fewer than `want` look available.
    #[inline(always)]
    fn available_for(&self, want: usize) -> usize {
        let cached = self.tail_cache.get().wrapping_sub(self.head);
        if cached >= want {
            cached
        } else {
            self.available()
        }
    }

    /// Why the ring is empty. A sender's final sends happen-before its closed flag,
    /// so after seeing the flag one more look at the tail is conclusive.
    #[cold]
    fn empty_error(&self) -> TryRecvError {
        if self.ring.is_sender_closed() && self.available() == 0 {
            TryRecvError::Disconnected
        } else {
            TryRecvError::Empty
        }
    }

    #[inline(always)]
    fn release(&mut self, head: usize) {
        self.head = head;
        self.ring.head.store(head, Release);
        self.peer.notify();
    }

    fn wait_ready(&self, deadline: Option<Instant>) -> bool {
        self.ring
            .receiver_waker
            .wait_until_deadline(|| self.is_ready(), deadline)
    }

    /// True if a receive would not block: a value is queued or the sender is gone.
    /// Use it in the condition of [`TaskWaker::wait_until`] for tasks with several
    /// inputs.
    pub fn is_ready(&self) -> bool {
        self.available() > 0 || self.is_disconnected()
    }

    /// True once the sender has been dropped (values may still be queued).
    pub fn is_disconnected(&self) -> bool {
        self.ring.is_sender_closed()
    }

    /// Values queued right now.
    pub fn len(&self) -> usize {
        self.available()
    }

    /// True if nothing is queued right now.
    pub fn is_empty(&self) -> bool {
        self.available() == 0
    }

    /// The fixed capacity given at construction.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The waker this end sleeps on when the ring is empty.
    pub fn waker(&self) -> &WakerRef {
        &self.ring.receiver_waker
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.ring.closed.receiver.store(true, Release);
        // Drop what is queued now rather than when the sender goes; anything sent
        // after this is dropped with the ring.
        while self.try_recv().is_ok() {}
        self.peer.notify();
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .field("disconnected", &self.is_disconnected())
            .finish()
    }
}

/// Iterator over the queued values of a [`Receiver`], oldest first.
pub struct Queued<'a, T> {
    ring: &'a Ring<T>,
    next: usize,
    end: usize,
}

impl<'a, T> Iterator for Queued<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        if self.next == self.end {
            return None;
        }
        // SAFETY: published slot; the receiver is borrowed immutably for 'a, so it
        // stays unread.
        let value = unsafe { self.ring.get(self.next) };
        self.next = self.next.wrapping_add(1);
        Some(value)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end.wrapping_sub(self.next);
        (n, Some(n))
    }
}

impl<T> ExactSizeIterator for Queued<'_, T> {}
