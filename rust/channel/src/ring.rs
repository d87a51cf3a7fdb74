//! The shared ring: slots, the two indices and the two "closed" flags.
//!
//! Indices are free-running (wrapping) counters; a slot is `index & mask` in a buffer
//! of `capacity.next_power_of_two()` slots, of which at most `capacity` are occupied.
//! Masking instead of a modulo (or rtrb's 2×capacity folding) keeps the index maths to
//! one AND and one wrapping subtraction, at the price of < 2× slot memory.

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

use crossbeam_utils::CachePadded;

use super::sync::{AtomicBool, AtomicUsize, UnsafeCell};
use super::waker::WakerRef;

pub(crate) struct Ring<T> {
    /// Next index to read; written only by the receiver.
    pub(crate) head: CachePadded<AtomicUsize>,
    /// Next index to write; written only by the sender.
    pub(crate) tail: CachePadded<AtomicUsize>,
    /// Read-mostly line: flags written once, when an end is dropped.
    pub(crate) closed: CachePadded<Closed>,
    pub(crate) capacity: usize,
    pub(crate) mask: usize,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    /// Sleeps on a full ring; notified by the receiver.
    pub(crate) sender_waker: WakerRef,
    /// Sleeps on an empty ring; notified by the sender.
    pub(crate) receiver_waker: WakerRef,
}

pub(crate) struct Closed {
    pub(crate) sender: AtomicBool,
    pub(crate) receiver: AtomicBool,
}

// SAFETY: the sender and receiver access disjoint slots (the protocol below), values
// of T cross threads, so T: Send suffices; `peek` hands out `&T` only to the receiver.
unsafe impl<T: Send> Send for Ring<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Ring<T> {}

impl<T> Ring<T> {
    pub(crate) fn new(capacity: usize, sender_waker: WakerRef, receiver_waker: WakerRef) -> Self {
        let physical = capacity.next_power_of_two();
        let slots = (0..physical)
            .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
            .collect();
        Self {
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            closed: CachePadded::new(Closed {
                sender: AtomicBool::new(false),
                receiver: AtomicBool::new(false),
            }),
            capacity,
            mask: physical - 1,
            slots,
            sender_waker,
            receiver_waker,
        }
    }

    #[inline(always)]
    fn slot(&self, index: usize) -> &UnsafeCell<MaybeUninit<T>> {
        // SAFETY: mask < slots.len() by construction.
        unsafe { self.slots.get_unchecked(index & self.mask) }
    }

    /// Writes `value` into the slot of `index`.
    /// SAFETY: the caller (the sender) owns that slot: it is free and unpublished.
    #[inline(always)]
    pub(crate) unsafe fn write(&self, index: usize, value: T) {
        self.slot(index).with_mut(|p| unsafe { (*p).write(value) });
    }

    /// Moves the value out of the slot of `index`.
    /// SAFETY: the caller (the receiver) owns that slot: it is published and unread.
    #[inline(always)]
    pub(crate) unsafe fn read(&self, index: usize) -> T {
        self.slot(index)
            .with(|p| unsafe { (*p).assume_init_read() })
    }

    /// A reference to the value in the slot of `index`.
    /// SAFETY: the slot is published, and stays unread while the reference lives.
    #[inline(always)]
    pub(crate) unsafe fn get(&self, index: usize) -> &T {
        self.slot(index).with(|p| unsafe { (*p).assume_init_ref() })
    }

    /// Copies `src` into the slots starting at `index` (at most two memcpys).
    /// SAFETY: the caller owns `src.len()` free slots starting at `index`.
    #[inline]
    pub(crate) unsafe fn write_slice(&self, index: usize, src: &[T])
    where
        T: Copy,
    {
        #[cfg(feature = "loom")]
        for (i, v) in src.iter().enumerate() {
            unsafe { self.write(index.wrapping_add(i), *v) };
        }
        #[cfg(not(feature = "loom"))]
        unsafe {
            let (first, start) = self.contiguous(index, src.len());
            let base = self.base_ptr();
            std::ptr::copy_nonoverlapping(src.as_ptr(), base.add(start), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), base, src.len() - first);
        }
    }

    /// Moves `n` values starting at `index` into `dst` (at most two memcpys).
    /// SAFETY: the caller owns `n` published slots at `index`, `dst` has room for `n`.
    #[inline]
    pub(crate) unsafe fn read_to_ptr(&self, index: usize, dst: *mut T, n: usize) {
        #[cfg(feature = "loom")]
        for i in 0..n {
            unsafe { dst.add(i).write(self.read(index.wrapping_add(i))) };
        }
        #[cfg(not(feature = "loom"))]
        unsafe {
            let (first, start) = self.contiguous(index, n);
            let base = self.base_ptr();
            std::ptr::copy_nonoverlapping(base.add(start), dst, first);
            std::ptr::copy_nonoverlapping(base, dst.add(first), n - first);
        }
    }

    /// (length of the first contiguous run, its physical start) for `n` slots at `index`.
    #[cfg(not(feature = "loom"))]
    #[inline(always)]
    fn contiguous(&self, index: usize, n: usize) -> (usize, usize) {
        let start = index & self.mask;
        (n.min(self.slots.len() - start), start)
    }

    #[cfg(not(feature = "loom"))]
    #[inline(always)]
    fn base_ptr(&self) -> *mut T {
        // UnsafeCell<MaybeUninit<T>> is repr(transparent) over T's layout.
        self.slots.as_ptr() as *mut T
    }

    pub(crate) fn is_sender_closed(&self) -> bool {
        self.closed.sender.load(Acquire)
    }

    pub(crate) fn is_receiver_closed(&self) -> bool {
        self.closed.receiver.load(Acquire)
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        if std::mem::needs_drop::<T>() {
            let mut head = self.head.load(Relaxed);
            let tail = self.tail.load(Relaxed);
            while head != tail {
                // SAFETY: both ends are gone; slots in head..tail hold values.
                drop(unsafe { self.read(head) });
                head = head.wrapping_add(1);
            }
        }
    }
}
